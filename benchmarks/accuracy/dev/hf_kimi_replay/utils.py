"""Helpers for tests and notebooks: compare caches, keep gate rings in float32."""

import torch

from .cache_utils import StaticReplayCache
from .configuration_kimi_replay import KimiReplayConfig

_GATE_DTYPE = torch.float


def gate_dtype() -> torch.dtype:
    return _GATE_DTYPE


def as_fp32_gate_cache(g_cache: torch.Tensor) -> torch.Tensor:
    return g_cache if g_cache.dtype == torch.float32 else g_cache.float()


def clone_cache_gates(cache: StaticReplayCache) -> list[torch.Tensor]:
    g_cache = [layer_g.clone().to(dtype=gate_dtype()) for layer_g in cache.g_cache]
    return g_cache


def gate_cache_summary(cache: StaticReplayCache) -> dict[str, float]:
    return {f"layer{i}": float(g.abs().sum()) for i, g in enumerate(cache.g_cache)}


def build_cloned_gates() -> dict[str, object]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    g_cache = clone_cache_gates(cache)
    extra_g_cache = as_fp32_gate_cache(torch.zeros(2, 2, 4, 4, dtype=torch.bfloat16))
    return {"g_cache": g_cache, "extra_g_cache": extra_g_cache, "summary": gate_cache_summary(cache)}
