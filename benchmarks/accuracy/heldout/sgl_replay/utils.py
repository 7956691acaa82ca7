"""Memory accounting and debug views of the hybrid pool."""

import torch

from .memory_pool import HybridMambaPool
from .state_params import KimiLinearStateParams


def pool_size_bytes(pool: HybridMambaPool) -> int:
    return sum(t.numel() * t.element_size() for t in (pool.temporal, pool.d_ring, pool.k_ring, pool.gate_ring))


def gate_ring_dtypes(pool: HybridMambaPool) -> dict[str, str]:
    gate_ring = {f"layer{i}": str(pool.layer_cache(i).gate_ring.dtype) for i in range(pool.gate_ring.shape[0])}
    return gate_ring


def build_pool_accounting() -> dict[str, object]:
    pool = HybridMambaPool(3, KimiLinearStateParams())
    gate_ring = pool.gate_ring.detach()
    return {
        "bytes": pool_size_bytes(pool),
        "dtypes": gate_ring_dtypes(pool),
        "gate_ring": gate_ring,
        "gate_ring_copy": gate_ring.clone(),
    }
