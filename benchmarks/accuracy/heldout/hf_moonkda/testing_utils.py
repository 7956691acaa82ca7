"""Utilities used by the model tests and the conversion script."""

import torch

from .cache_utils import MoonKdaFp32GateCache
from .configuration_moonkda import MoonKdaConfig

GATE_DTYPE = torch.float32


def gate_cache_dtype() -> torch.dtype:
    return GATE_DTYPE


def ensure_fp32(gate_cache: torch.Tensor) -> torch.Tensor:
    return gate_cache.to(torch.float32) if gate_cache.dtype != torch.float32 else gate_cache


def copy_gate_caches(cache: MoonKdaFp32GateCache) -> list[torch.Tensor]:
    gate_cache = [ring.detach().to(gate_cache_dtype(), copy=True) for ring in cache.gate_cache]
    return gate_cache


def gate_cache_norms(cache: MoonKdaFp32GateCache) -> list[float]:
    return [float(ring.norm()) for ring in cache.gate_cache]


def build_copied_gate_caches() -> dict[str, object]:
    cache = MoonKdaFp32GateCache(MoonKdaConfig(), 2)
    return {
        "gate_cache": copy_gate_caches(cache),
        "fresh_gate_cache": ensure_fp32(torch.zeros(2, 2, 4, 4, dtype=torch.float16)),
        "norms": gate_cache_norms(cache),
    }
