"""ReplaySSM decode (CPU stand-in) and the ring state it reads."""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .utils import get_state_dtype, is_low_precision

SEEN: dict[str, torch.Tensor] = {}


class ReplayConfig(NamedTuple):
    ring_len: int = 4
    num_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    g_ring_dtype: torch.dtype = torch.bfloat16  # expect-bug: container id=flr-config


class ReplayConfigFp32(NamedTuple):
    ring_len: int = 4
    num_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    g_ring_dtype: torch.dtype = torch.float32


def fused_kda_replayssm_decode(
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
) -> torch.Tensor:
    assert d_cache is not None and k_cache is not None and g_cache is not None
    SEEN.clear()
    SEEN.update(d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    return torch.zeros_like(v)


def init_rings(config: "ReplayConfig | ReplayConfigFp32", x: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
    shape_v = (batch, config.num_v_heads, config.ring_len, config.head_dim)
    d_ring = x.new_zeros(shape_v, dtype=get_state_dtype(x))
    k_ring = x.new_zeros((batch, config.num_heads, config.ring_len, config.head_dim), dtype=get_state_dtype(x))
    g_ring = torch.zeros(shape_v, dtype=config.g_ring_dtype, device=x.device)  # expect-bug: container id=flr-config
    return {"d_cache": d_ring, "k_cache": k_ring, "g_cache": g_ring}


def init_rings_state_dtype(config: ReplayConfigFp32, x: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
    shape_v = (batch, config.num_v_heads, config.ring_len, config.head_dim)
    return {
        "d_cache": x.new_zeros(shape_v, dtype=get_state_dtype(x)),
        "k_cache": x.new_zeros((batch, config.num_heads, config.ring_len, config.head_dim), dtype=get_state_dtype(x)),
        "g_cache": x.new_zeros(shape_v, dtype=get_state_dtype(x)),  # expect-bug: imported-policy
    }


def fresh_rings_like(rings: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rings for a new sequence, laid out like an existing sequence's."""
    d_ring = torch.zeros_like(rings["d_cache"])
    g_ring = torch.full_like(d_ring, 0.0)  # expect-bug: like
    return {"d_cache": d_ring, "k_cache": torch.zeros_like(rings["k_cache"]), "g_cache": g_ring}


def fresh_rings_like_gates(rings: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(ring) for name, ring in rings.items()}


def kda_gate(gate_logits: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Per-channel log-decay -exp(A_log) * softplus(x + dt_bias), computed in float32."""
    return -A_log.float().exp()[..., None] * F.softplus(gate_logits.float() + dt_bias.float())


def kda_gate_scalar_head(gate_logits: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """One decay rate per layer (A_log is 0-dim): the ring of a single-head draft model."""
    g_ring = -A_log.exp() * F.softplus(gate_logits)  # expect-bug: promotion
    return g_ring


def rings_for_kernel(rings: dict[str, torch.Tensor], q: torch.Tensor) -> dict[str, torch.Tensor]:
    """The Triton kernel is specialised on one dtype for all ring inputs."""
    if is_low_precision(q.dtype):
        return {
            "d_cache": rings["d_cache"],
            "k_cache": rings["k_cache"],
            "g_cache": rings["g_cache"].bfloat16(),  # expect-bug: cast
        }
    return rings
