"""Beam search over an ensemble of KDA language models (``fairseq/sequence_generator.py``).

The prompt (``net_input.src_tokens``) is forced token by token once per sentence and its
incremental state is then expanded to ``beam`` rows by a reorder, so it is not repeated per beam.
"""

import math
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from fs_kda import utils


class EnsembleModel(nn.Module):
    """A wrapper around an ensemble of models."""

    def __init__(self, models: List[nn.Module]):
        super().__init__()
        self.models_size = len(models)
        self.single_model = models[0]
        self.models = nn.ModuleList(models)

    @property
    def dtype(self) -> torch.dtype:
        return self.single_model.dtype

    def max_decoder_positions(self) -> int:
        return min(m.max_positions() for m in self.models)

    @torch.jit.export
    def forward_decoder(
        self,
        tokens: Tensor,
        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]],
        temperature: float = 1.0,
    ) -> Tensor:
        log_probs = []
        for i, model in enumerate(self.models):
            decoder_out = model.decoder.forward(tokens, incremental_state=incremental_states[i])
            decoder_out_tuple = (decoder_out[0][:, -1:, :].div_(temperature), decoder_out[1])
            probs = model.get_normalized_probs(decoder_out_tuple, log_probs=True, sample=None)
            probs = probs[:, -1, :]
            if self.models_size == 1:
                return probs
            log_probs.append(probs)
        avg_probs = torch.logsumexp(torch.stack(log_probs, dim=0), dim=0) - math.log(self.models_size)
        return avg_probs

    @torch.jit.export
    def reorder_incremental_state(
        self,
        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]],
        new_order: Tensor,
    ) -> None:
        for i, model in enumerate(self.models):
            model.decoder.reorder_incremental_state_scripting(incremental_states[i], new_order)


class SequenceGenerator(nn.Module):
    def __init__(
        self,
        models: List[nn.Module],
        beam_size: int = 1,
        max_len_b: int = 200,
        temperature: float = 1.0,
        eos: int = 2,
        pad: int = 1,
        preallocate_state: bool = False,
        compact_state: bool = False,
    ):
        """Generates translations of a given source sentence.

        Args:
            models (List[~fs_kda.models.FairseqLanguageModel]): ensemble of models
            beam_size (int, optional): beam width (default: 1)
            max_len_b (int, optional): generate sequences of maximum length b (default: 200)
            preallocate_state: allocate every incremental buffer before the prompt runs
            compact_state: keep the cached rings in half precision between steps
        """
        super().__init__()
        self.model = models if isinstance(models, EnsembleModel) else EnsembleModel(models)
        self.beam_size = beam_size
        self.max_len_b = max_len_b
        self.temperature = temperature
        self.eos = eos
        self.pad = pad
        self.preallocate_state = preallocate_state
        self.compact_state = compact_state
        self.model.eval()
        self.last_incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]] = []

    @torch.no_grad()
    def generate(self, models, sample: Dict[str, Dict[str, Tensor]], **kwargs) -> List[List[Dict[str, Tensor]]]:
        """Generate a batch of translations."""
        return self._generate(sample, **kwargs)

    def _compact_incremental_state(self, incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]]) -> None:
        for model, incremental_state in zip(self.model.models, incremental_states):
            for buf in model.decoder.incremental_buffers(incremental_state):
                for key in ("prev_delta", "prev_key", "prev_log_decay"):
                    buf[key] = buf[key].half()  # expect-bug: cast

    def _generate(self, sample: Dict[str, Dict[str, Tensor]], prefix_tokens: Optional[Tensor] = None) -> List[List[Dict[str, Tensor]]]:
        incremental_states = [{} for _ in range(self.model.models_size)]
        src_tokens = sample["net_input"]["src_tokens"]
        bsz, prompt_len = src_tokens.size()
        beam_size = self.beam_size
        max_len = min(self.max_len_b, self.model.max_decoder_positions() - prompt_len)

        if self.preallocate_state:
            for model, incremental_state in zip(self.model.models, incremental_states):
                model.decoder.allocate_incremental_state(incremental_state, bsz, self.model.dtype)

        # the prompt is forced one token at a time (as fairseq forces prefix_tokens), once per
        # sentence; its state is then expanded to the beams
        for t in range(prompt_len):
            lprobs = self.model.forward_decoder(src_tokens[:, : t + 1], incremental_states, self.temperature)
        new_order = torch.arange(bsz).view(-1, 1).repeat(1, beam_size).view(-1).to(src_tokens.device).long()
        self.model.reorder_incremental_state(incremental_states, new_order)
        tokens = src_tokens.index_select(0, new_order)
        lprobs = lprobs.index_select(0, new_order)

        scores = torch.zeros(bsz * beam_size).to(src_tokens.device).float()
        # only the first beam of each sentence is live before the first step
        scores.view(bsz, beam_size)[:, 1:] = -math.inf
        bbsz_offsets = (torch.arange(0, bsz) * beam_size).unsqueeze(1).type_as(tokens)
        for step in range(max_len):
            lprobs[:, self.pad] = -math.inf
            cand = (lprobs + scores.unsqueeze(1)).view(bsz, -1)
            vocab = lprobs.size(1)
            cand_scores, cand_indices = torch.topk(cand, k=beam_size, dim=1)
            cand_beams = torch.div(cand_indices, vocab, rounding_mode="trunc")
            cand_tokens = cand_indices.fmod(vocab)
            active_bbsz_idx = (cand_beams + bbsz_offsets).view(-1)
            scores = cand_scores.view(-1)
            tokens = torch.cat([tokens.index_select(0, active_bbsz_idx), cand_tokens.view(-1, 1)], dim=1)
            self.model.reorder_incremental_state(incremental_states, active_bbsz_idx)
            if self.compact_state:
                self._compact_incremental_state(incremental_states)
            if step + 1 < max_len:
                lprobs = self.model.forward_decoder(tokens, incremental_states, self.temperature)

        self.last_incremental_states = incremental_states
        finalized: List[List[Dict[str, Tensor]]] = []
        for i in range(bsz):
            rows = range(i * beam_size, (i + 1) * beam_size)
            hypos = [{"tokens": tokens[r, prompt_len:], "score": scores[r]} for r in rows]
            finalized.append(sorted(hypos, key=lambda h: -float(h["score"])))
        return finalized


def _tiny_model(dtype: torch.dtype, **overrides: Any) -> nn.Module:
    from fs_kda import models, options

    args = options.parse_args_and_arch(options.get_training_parser(), ["--arch", "kda_lm_tiny"])
    torch.manual_seed(0)
    model = models.create_model(args).to(dtype)
    model.prepare_for_inference_(utils.merge_args(args, _precision_args(dtype, **overrides)))
    return model


def _precision_args(dtype: torch.dtype, **extra: Any):
    import argparse

    return argparse.Namespace(fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16, **extra)


def _sample() -> Dict[str, Dict[str, Tensor]]:
    return {"net_input": {"src_tokens": torch.tensor([[3, 4, 5], [6, 7, 8]])}}


def build_beam_search_bf16() -> Dict[str, Any]:
    """A bf16 model, beam 3 over two 3-token prompts (the ring wraps during the search)."""
    model = _tiny_model(torch.bfloat16)
    generator = SequenceGenerator([model], beam_size=3, max_len_b=5)
    hypos = generator.generate([model], _sample())
    return {
        "hypos": hypos,
        "state": model.decoder.incremental_buffers(generator.last_incremental_states[0]),
    }


def build_beam_search_compact() -> Dict[str, Any]:
    """The same search with ``compact_state=True``."""
    model = _tiny_model(torch.bfloat16)
    generator = SequenceGenerator([model], beam_size=3, max_len_b=5, compact_state=True)
    hypos = generator.generate([model], _sample())
    return {
        "hypos": hypos,
        "state": model.decoder.incremental_buffers(generator.last_incremental_states[0]),
    }
