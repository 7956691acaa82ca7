"""ReplaySSM decode op (CPU stand-in for the Triton kernel) and its ring packing helpers."""

from typing import Optional

import torch

from ..utils import input_guard

LAST_RINGS: dict[str, torch.Tensor] = {}


@input_guard
def fused_recurrent_kda_replayssm_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    d_cache: Optional[torch.Tensor] = None,
    k_cache: Optional[torch.Tensor] = None,
    g_cache: Optional[torch.Tensor] = None,
    write_pos: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    assert d_cache is not None and k_cache is not None and g_cache is not None
    LAST_RINGS.clear()
    LAST_RINGS.update(d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    o = torch.zeros_like(v)
    return o, initial_state


def pack_replay_rings(
    d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor
) -> torch.Tensor:
    """One flat byte buffer per slot, so a slot moves with one copy."""
    parts = [t.reshape(t.shape[0], -1).view(torch.uint8) for t in (d_cache, k_cache, g_cache)]
    return torch.cat(parts, dim=1)


def unpack_replay_rings(
    packed: torch.Tensor,
    heads: int,
    value_heads: int,
    ring: int,
    head_k: int,
    head_v: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    slots, itemsize = packed.shape[0], torch.empty(0, dtype=dtype).element_size()
    d_bytes = value_heads * ring * head_v * itemsize
    k_bytes = heads * ring * head_k * itemsize
    d_cache = packed[:, :d_bytes].contiguous().view(dtype).view(slots, value_heads, ring, head_v)
    k_cache = packed[:, d_bytes : d_bytes + k_bytes].contiguous().view(dtype).view(slots, heads, ring, head_k)
    g_cache = packed[:, d_bytes + k_bytes :].contiguous().view(dtype)  # expect-bug: cast
    return d_cache, k_cache, g_cache.view(slots, value_heads, ring, -1)


def unpack_replay_rings_fp32_gates(
    packed: torch.Tensor,
    heads: int,
    value_heads: int,
    ring: int,
    head_k: int,
    head_v: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    slots, itemsize = packed.shape[0], torch.empty(0, dtype=dtype).element_size()
    d_bytes = value_heads * ring * head_v * itemsize
    k_bytes = heads * ring * head_k * itemsize
    d_cache = packed[:, :d_bytes].contiguous().view(dtype).view(slots, value_heads, ring, head_v)
    k_cache = packed[:, d_bytes : d_bytes + k_bytes].contiguous().view(dtype).view(slots, heads, ring, head_k)
    g_cache = packed[:, d_bytes + k_bytes :].contiguous().view(torch.float32)
    return d_cache, k_cache, g_cache.view(slots, value_heads, ring, -1)
