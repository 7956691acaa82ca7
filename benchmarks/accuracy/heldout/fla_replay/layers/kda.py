"""The KimiDeltaAttention layer (fla.layers style) with ReplaySSM decode."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import fused_kda_replayssm_decode
from ..ops.replay import (
    SEEN,
    ReplayConfig,
    ReplayConfigFp32,
    fresh_rings_like,
    fresh_rings_like_gates,
    init_rings,
    init_rings_state_dtype,
    kda_gate,
    kda_gate_scalar_head,
    rings_for_kernel,
)


class KimiDeltaAttention(nn.Module):
    def __init__(self, hidden_size: int = 16, head_dim: int = 4, num_heads: int = 1, num_v_heads: int = 2,
                 layer_idx: int = 0) -> None:
        super().__init__()
        self.head_dim, self.num_heads, self.num_v_heads, self.layer_idx = head_dim, num_heads, num_v_heads, layer_idx
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_v_heads * head_dim, bias=False)
        self.f_proj = nn.Linear(hidden_size, num_v_heads * head_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(num_v_heads, head_dim))

    def _qkvg(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        q = self.q_proj(x).view(b, 1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, 1, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(b, 1, self.num_v_heads, self.head_dim)
        g = kda_gate(self.f_proj(x).view(b, 1, self.num_v_heads, self.head_dim), self.A_log, self.dt_bias)
        return q, k, v, g

    def step(self, x: torch.Tensor, rings: dict[str, torch.Tensor], **kwargs: Any) -> torch.Tensor:
        q, k, v, g = self._qkvg(x)
        return fused_kda_replayssm_decode(q, k, v, g, torch.ones(x.shape[0]), **rings, **kwargs)

    def step_kernel_rings(self, x: torch.Tensor, rings: dict[str, torch.Tensor]) -> torch.Tensor:
        q, k, v, g = self._qkvg(x)
        g_ring = rings_for_kernel(rings, q)
        return fused_kda_replayssm_decode(q, k, v, g, torch.ones(x.shape[0]), **g_ring)


def decode_kwargs(layer: KimiDeltaAttention, x: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
    """Builds the ring arguments of a fresh sequence for `layer.step`."""
    v_shape = (batch, layer.num_v_heads, 4, layer.head_dim)
    d_ring = torch.zeros(v_shape, dtype=x.dtype)
    return dict(
        d_cache=d_ring,
        k_cache=torch.zeros(batch, layer.num_heads, 4, layer.head_dim, dtype=x.dtype),
        g_cache=d_ring.new_zeros(v_shape),  # expect-bug: decode-arg
    )


def decode_kwargs_fp32(layer: KimiDeltaAttention, x: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
    v_shape = (batch, layer.num_v_heads, 4, layer.head_dim)
    d_ring = torch.zeros(v_shape, dtype=x.dtype)
    return dict(
        d_cache=d_ring,
        k_cache=torch.zeros(batch, layer.num_heads, 4, layer.head_dim, dtype=x.dtype),
        g_cache=d_ring.new_zeros(v_shape, dtype=torch.float32),
    )


def draft_ring_from_logits(layer: KimiDeltaAttention, logits: torch.Tensor) -> torch.Tensor:
    g_ring = kda_gate_scalar_head(logits, layer.A_log[0])
    return g_ring


def unpack_rings(flat: torch.Tensor, batch: int, num_v_heads: int, ring: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Snapshots store d and g of a slot as one bf16 buffer each half; g was stored as raw fp32 bytes."""
    half = flat.shape[-1] // 2
    d_ring = flat[..., :half].view(batch, num_v_heads, ring, dim)
    g_ring = flat[..., half:].contiguous().view(torch.float32).view(batch, num_v_heads, ring, -1)
    return d_ring, g_ring


def _layer() -> tuple[KimiDeltaAttention, torch.Tensor]:
    torch.manual_seed(0)
    return KimiDeltaAttention().to(torch.bfloat16), torch.randn(2, 16).bfloat16()


def build_step_fp32_config() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, init_rings(ReplayConfigFp32(), x, 2))
    return dict(SEEN)


def build_step_default_config() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, init_rings(ReplayConfig(), x, 2))
    return dict(SEEN)


def build_step_kernel_rings() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step_kernel_rings(x, init_rings(ReplayConfigFp32(), x, 2))
    return dict(SEEN)


def build_step_decode_kwargs() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, decode_kwargs(layer, x, 2))
    return dict(SEEN)


def build_step_decode_kwargs_fp32() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, decode_kwargs_fp32(layer, x, 2))
    return dict(SEEN)


def build_draft_ring() -> dict[str, torch.Tensor]:
    layer = KimiDeltaAttention()
    return {"g_ring": draft_ring_from_logits(layer, torch.randn(2, 2, 4, 4).bfloat16())}


def build_gate_fp32() -> dict[str, torch.Tensor]:
    layer = KimiDeltaAttention().bfloat16()
    g_ring = kda_gate(torch.randn(2, 1, 2, 4).bfloat16(), layer.A_log, layer.dt_bias)
    return {"g_ring": g_ring}


def build_unpack_snapshot() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    d = torch.randn(2, 2, 4, 4).bfloat16().reshape(2, -1)
    g = (-torch.rand(2, 2, 4, 2)).view(torch.bfloat16).reshape(2, -1)
    d_ring, g_ring = unpack_rings(torch.cat([d, g], dim=-1), 2, 2, 4, 4)
    return {"d_ring": d_ring, "g_ring": g_ring}


def build_step_state_dtype_rings() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, init_rings_state_dtype(ReplayConfigFp32(), x, 2))
    return dict(SEEN)


def build_step_fresh_rings() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, fresh_rings_like(init_rings(ReplayConfigFp32(), x, 2)))
    return dict(SEEN)


def build_step_fresh_rings_per_ring() -> dict[str, torch.Tensor]:
    layer, x = _layer()
    layer.step(x, fresh_rings_like_gates(init_rings(ReplayConfigFp32(), x, 2)))
    return dict(SEEN)
