"""The sampling loop: each layer's kernel gets its cache tensors as keyword arguments."""

from typing import Any

import torch

from .cache_utils import MoonKdaFp32GateCache
from .configuration_moonkda import MoonKdaConfig

KWARGS_SEEN: dict[str, torch.Tensor] = {}

RING_NAMES = ("value_ring", "key_ring", "gate_cache")


def moonkda_replayssm_decode(hidden: torch.Tensor, **cache_kwargs: torch.Tensor) -> torch.Tensor:
    KWARGS_SEEN.clear()
    KWARGS_SEEN.update(cache_kwargs)
    return hidden


def layer_cache_kwargs(cache: MoonKdaFp32GateCache, idx: int, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: getattr(cache, name)[idx].to(hidden.dtype) for name in RING_NAMES}  # expect-bug: decode-arg


def layer_cache_kwargs_fp32(cache: MoonKdaFp32GateCache, idx: int, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    kwargs = {name: getattr(cache, name)[idx] for name in RING_NAMES}
    kwargs["gate_cache"] = kwargs["gate_cache"].float()
    return kwargs


def sample_step(cache: MoonKdaFp32GateCache, hidden: torch.Tensor, fp32: bool) -> dict[str, Any]:
    for idx in range(len(cache.gate_cache)):
        kwargs = layer_cache_kwargs_fp32(cache, idx, hidden) if fp32 else layer_cache_kwargs(cache, idx, hidden)
        moonkda_replayssm_decode(hidden, **kwargs)
    return dict(KWARGS_SEEN)


def build_sample_step() -> dict[str, Any]:
    return sample_step(MoonKdaFp32GateCache(MoonKdaConfig(), 2), torch.randn(2, 16).bfloat16(), fp32=False)


def build_sample_step_fp32() -> dict[str, Any]:
    return sample_step(MoonKdaFp32GateCache(MoonKdaConfig(), 2), torch.randn(2, 16).bfloat16(), fp32=True)
