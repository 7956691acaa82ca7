# lm-evaluation-harness support, after gpt-fast's eval.py: each request is scored with the
# model's prefill on freshly set up caches.
import contextlib
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .generate import model_forward
from .model import Transformer


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def setup_cache_padded_seq_input_pos_max_seq_length_for_prompt(model: Transformer, prompt: torch.Tensor, max_new_tokens: int, max_seq_length: Optional[int] = None):
    """Sets up model cache and does some bookkeeping calculations for prompt, input_pos and
    max_seq_length that are needed for prefill or model_forward."""
    T = prompt.size(0)
    T_new = T + max_new_tokens
    if max_seq_length is None:
        max_seq_length = min(T_new, model.config.block_size)
    device = prompt.device
    # the caches and the rope table are rebuilt per request: build them in the model's precision
    # so that the compiled prefill has no dtype conversions in it
    with torch.device(device), _default_dtype(model.output.weight.dtype):  # expect-bug: default-dtype id=eval-default
        model.max_seq_length = -1
        model.setup_caches(max_batch_size=1, max_seq_length=max_seq_length)
    seq = torch.empty(T_new, dtype=prompt.dtype, device=device)
    seq[:T] = prompt
    return seq, torch.arange(0, T, device=device), max_seq_length


class GPTFastEvalWrapper:
    """The part of lm_eval's ``TemplateLM`` that gpt-fast implements (``loglikelihood``)."""

    def __init__(self, model: Transformer, max_seq_length: Optional[int] = None):
        self._model = model
        self._device = next(model.parameters()).device
        self._max_seq_length = 2048 if max_seq_length is None else max_seq_length

    def _model_call(self, inps: torch.Tensor) -> torch.Tensor:
        inps = inps.squeeze(0)  # TODO: make batches work
        seq, input_pos, _ = setup_cache_padded_seq_input_pos_max_seq_length_for_prompt(self._model, inps, 1, self._max_seq_length)
        return model_forward(self._model, seq.index_select(0, input_pos).view(1, -1), input_pos)

    @torch.no_grad()
    def loglikelihood(self, requests: List[Tuple[List[int], List[int]]]) -> List[float]:
        scores = []
        for context, continuation in requests:
            tokens = torch.tensor(context + continuation, dtype=torch.int, device=self._device)
            logprobs = F.log_softmax(self._model_call(tokens[None, :-1])[0, -len(continuation):].float(), dim=-1)
            scores.append(logprobs.gather(-1, tokens[-len(continuation):].long()[:, None]).sum().item())
        return scores


def build_eval_request():
    model = Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16).eval()
    scores = GPTFastEvalWrapper(model, max_seq_length=16).loglikelihood([([1, 2], [3]), ([4], [5, 6])])
    return {"model": model, "scores": torch.tensor(scores)}
