"""Replay ring layouts and allocation for fla models (used by generation and by the tests)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .utils import autocast_dtype


@dataclass
class ReplayRingSpec:
    num_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    ring_len: int = 4
    state_dtype: torch.dtype = torch.bfloat16
    g_cache_dtype: torch.dtype = torch.bfloat16  # expect-bug: container id=fla-spec


@dataclass
class ReplayRingSpecFp32:
    num_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    ring_len: int = 4
    state_dtype: torch.dtype = torch.bfloat16
    g_cache_dtype: torch.dtype = torch.float32


def allocate_replay_rings(spec: ReplayRingSpec | ReplayRingSpecFp32, batch_size: int) -> dict[str, torch.Tensor]:
    shape_v = (batch_size, spec.num_v_heads, spec.ring_len, spec.head_dim)
    return {
        "d_cache": torch.zeros(shape_v, dtype=spec.state_dtype),
        "k_cache": torch.zeros(batch_size, spec.num_heads, spec.ring_len, spec.head_dim, dtype=spec.state_dtype),
        "g_cache": torch.zeros(shape_v, dtype=spec.g_cache_dtype),  # expect-bug: container id=fla-spec
    }


def rings_like_activations(x: torch.Tensor, spec: ReplayRingSpecFp32, batch_size: int) -> dict[str, torch.Tensor]:
    """Under autocast the rings follow the autocast dtype, like the activations do."""
    shape_v = (batch_size, spec.num_v_heads, spec.ring_len, spec.head_dim)
    return {
        "d_cache": x.new_zeros(shape_v, dtype=autocast_dtype(x)),
        "g_cache": x.new_zeros(shape_v, dtype=autocast_dtype(x)),  # expect-bug: imported-policy
    }


def shift_in_gates(g_cache: torch.Tensor, g_new: torch.Tensor) -> torch.Tensor:
    """Drops the oldest row and appends g_new; cat promotes the bf16 gates to the ring's float32."""
    g_cache = torch.cat([g_cache[:, :, 1:], g_new.unsqueeze(2)], dim=2)
    return g_cache


def ring_from_gate_logits(gate_logits: list[torch.Tensor]) -> torch.Tensor:
    """Seeds the ring from the last prefill steps' gate logits (each [batch, heads, dim])."""
    g_cache = torch.stack([F.logsigmoid(logits) for logits in gate_logits], dim=2)  # expect-bug: promotion
    return g_cache


def ring_from_gate_logits_fp32(gate_logits: list[torch.Tensor]) -> torch.Tensor:
    g_cache = torch.stack([F.logsigmoid(logits.float()) for logits in gate_logits], dim=2)
    return g_cache


def _logits() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(2, 2, 4).to(torch.bfloat16) for _ in range(4)]


def build_rings_default_spec() -> dict[str, torch.Tensor]:
    return allocate_replay_rings(ReplayRingSpec(), 2)


def build_rings_fp32_spec() -> dict[str, torch.Tensor]:
    return allocate_replay_rings(ReplayRingSpecFp32(), 2)


def build_rings_like_bf16_activations() -> dict[str, torch.Tensor]:
    return rings_like_activations(torch.zeros(2, 8, dtype=torch.bfloat16), ReplayRingSpecFp32(), 2)


def build_shift_in_gates() -> dict[str, torch.Tensor]:
    rings = allocate_replay_rings(ReplayRingSpecFp32(), 2)
    g_new = -torch.rand(2, 2, 4).to(torch.bfloat16)
    return {"g_cache": shift_in_gates(rings["g_cache"], g_new)}


def build_ring_from_logits() -> dict[str, torch.Tensor]:
    return {"g_cache": ring_from_gate_logits(_logits())}


def build_ring_from_logits_fp32() -> dict[str, torch.Tensor]:
    return {"g_cache": ring_from_gate_logits_fp32(_logits())}
