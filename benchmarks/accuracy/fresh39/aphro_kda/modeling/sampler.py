"""A sampler layer that turns logits into next tokens (greedy, temperature, top-k, top-p)."""
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import nn


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: Optional[int] = 16
    seed: Optional[int] = None
    stop_token_ids: Optional[List[int]] = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, params: List[SamplingParams]) -> torch.Tensor:
        logits = logits.float()
        tokens = torch.empty(logits.shape[0], dtype=torch.long)
        for row, p in enumerate(params):
            if p.greedy:
                tokens[row] = logits[row].argmax()
                continue
            scores = logits[row] / p.temperature
            if p.top_k > 0:
                kth = torch.topk(scores, min(p.top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            probs = scores.softmax(-1)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                drop = sorted_probs.cumsum(-1) - sorted_probs > p.top_p
                probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
            generator = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
            tokens[row] = torch.multinomial(probs / probs.sum(), 1, generator=generator)[0]
        return tokens
