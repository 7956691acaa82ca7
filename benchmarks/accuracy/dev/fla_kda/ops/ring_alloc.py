"""One helper that allocates the three replay rings for a batch."""

import torch


def allocate_rings(
    batch: int, num_heads: int, num_v_heads: int, ring: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shapes = [
        (batch, num_v_heads, ring, head_dim),
        (batch, num_heads, ring, head_dim),
        (batch, num_v_heads, ring, head_dim),
    ]
    d_cache, k_cache, g_cache = (torch.zeros(shape, dtype=dtype) for shape in shapes)  # expect-bug: pool-dtype
    return d_cache, k_cache, g_cache


def allocate_rings_fp32_gates(
    batch: int, num_heads: int, num_v_heads: int, ring: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shapes_and_dtypes = [
        ((batch, num_v_heads, ring, head_dim), dtype),
        ((batch, num_heads, ring, head_dim), dtype),
        ((batch, num_v_heads, ring, head_dim), torch.float32),
    ]
    d_cache, k_cache, g_cache = (torch.zeros(shape, dtype=dt) for shape, dt in shapes_and_dtypes)
    return d_cache, k_cache, g_cache


def g_cache_mask(batch: int, ring: int) -> torch.Tensor:
    """Which ring rows hold a step (bool), per sequence."""
    g_cache_valid = torch.zeros(batch, ring, dtype=torch.bool)
    return g_cache_valid


def build_allocate_rings() -> dict[str, torch.Tensor]:
    d, k, g = allocate_rings(2, 1, 2, 4, 4, torch.bfloat16)
    return {"d_cache": d, "k_cache": k, "g_cache": g}


def build_allocate_rings_fp32_gates() -> dict[str, torch.Tensor]:
    d, k, g = allocate_rings_fp32_gates(2, 1, 2, 4, 4, torch.bfloat16)
    return {"d_cache": d, "k_cache": k, "g_cache": g, "valid": g_cache_mask(2, 4)}
