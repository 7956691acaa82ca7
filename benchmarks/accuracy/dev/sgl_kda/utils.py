"""Pool utilities: dtype checks, memory accounting and a mapping of per-layer debug info."""

import torch

from .configs import KimiLinearCacheParams
from .memory_pool import MambaPool


def pool_bytes(pool: MambaPool) -> int:
    cache = pool.mamba_cache
    tensors = [*cache.conv, cache.temporal, cache.replay_d, cache.replay_k, cache.replay_g]
    return sum(t.numel() * t.element_size() for t in tensors)


def debug_gate_rings(pool: MambaPool) -> dict[int, str]:
    g_cache: dict[int, str] = {}
    for layer_id in range(pool.mamba_cache.replay_g.shape[0]):
        g_cache[layer_id] = str(pool.mamba2_layer_cache(layer_id).replay_g.dtype)
    return g_cache


def build_pool_accounting() -> dict[str, object]:
    pool = MambaPool(3, KimiLinearCacheParams(), "cpu")
    replay_g = pool.mamba_cache.replay_g.contiguous()
    return {
        "bytes": pool_bytes(pool),
        "debug": debug_gate_rings(pool),
        "replay_g": replay_g,
        "replay_g_copy": replay_g.clone().detach(),
    }
