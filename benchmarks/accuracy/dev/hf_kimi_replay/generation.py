"""Greedy decoding loop: the layer kernel receives its cache tensors as keyword arguments."""

from typing import Any

import torch

from .cache_utils import StaticReplayCache
from .configuration_kimi_replay import KimiReplayConfig

SEEN: dict[str, torch.Tensor] = {}


def kimi_replayssm_decode(mixed_qkv: torch.Tensor, **cache_kwargs: torch.Tensor) -> torch.Tensor:
    SEEN.clear()
    SEEN.update(cache_kwargs)
    return mixed_qkv.new_zeros(mixed_qkv.shape[0], 1, 2, 4)


def prepare_cache_kwargs(cache: StaticReplayCache, layer_idx: int, model_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "initial_state": cache.recurrent_states[layer_idx],
        "d_cache": cache.d_cache[layer_idx],
        "k_cache": cache.k_cache[layer_idx],
        "g_cache": cache.g_cache[layer_idx].to(model_dtype),  # expect-bug: decode-arg
        "write_pos": cache.write_pos,
    }


def prepare_cache_kwargs_fp32(cache: StaticReplayCache, layer_idx: int, model_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "initial_state": cache.recurrent_states[layer_idx].to(model_dtype),
        "d_cache": cache.d_cache[layer_idx],
        "k_cache": cache.k_cache[layer_idx],
        "g_cache": cache.g_cache[layer_idx].to(torch.float32),
        "write_pos": cache.write_pos.to(torch.int32),
    }


def greedy_step(cache: StaticReplayCache, hidden: torch.Tensor, fp32_gates: bool) -> dict[str, Any]:
    prepare = prepare_cache_kwargs_fp32 if fp32_gates else prepare_cache_kwargs
    for layer_idx in range(len(cache.g_cache)):
        kimi_replayssm_decode(hidden, **prepare(cache, layer_idx, hidden.dtype))
    return dict(SEEN)


def build_greedy_step() -> dict[str, Any]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    return greedy_step(cache, torch.randn(2, 16).bfloat16(), fp32_gates=False)


def build_greedy_step_fp32() -> dict[str, Any]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    return greedy_step(cache, torch.randn(2, 16).bfloat16(), fp32_gates=True)
