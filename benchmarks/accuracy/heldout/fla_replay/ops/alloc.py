"""Ring allocation for a batch of new sequences."""

import torch

RING_LAYOUT = {"d_cache": "v", "k_cache": "k", "g_cache": "v"}


def new_rings(batch: int, heads: int, v_heads: int, ring: int, dim: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    rings: dict[str, torch.Tensor] = {}
    for name, kind in RING_LAYOUT.items():
        n = v_heads if kind == "v" else heads
        rings[name] = torch.empty(batch, n, ring, dim, dtype=dtype).zero_()  # expect-bug: pool-dtype
    return rings


def new_rings_fp32_gates(batch: int, heads: int, v_heads: int, ring: int, dim: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    rings: dict[str, torch.Tensor] = {}
    for name, kind in RING_LAYOUT.items():
        n = v_heads if kind == "v" else heads
        ring_dtype = torch.float32 if name == "g_cache" else dtype
        rings[name] = torch.empty(batch, n, ring, dim, dtype=ring_dtype).zero_()
    return rings


def ring_positions(batch: int) -> torch.Tensor:
    g_ring_pos = torch.zeros(batch, dtype=torch.int32)
    return g_ring_pos


def build_new_rings() -> dict[str, torch.Tensor]:
    return new_rings(2, 1, 2, 4, 4, torch.bfloat16)


def build_new_rings_fp32_gates() -> dict[str, torch.Tensor]:
    return {**new_rings_fp32_gates(2, 1, 2, 4, 4, torch.bfloat16), "pos": ring_positions(2)}
