"""Shared builders for the ReplaySSM kernel tests: random steps, pools, and a step driver."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from replaylint.kernels import (
    next_write_pos,
    recurrent_decode_reference,
    replayssm_decode,
    replayssm_decode_reference,
)


@dataclass(frozen=True)
class Case:
    """One test configuration. Defaults: a small shape that runs quickly on the CPU."""

    batch: int = 3
    num_heads: int = 2
    num_value_heads: int = 4
    head_k_dim: int = 16
    head_v_dim: int = 16
    ring_len: int = 4
    slots: int = 6
    state_dtype: torch.dtype = torch.float32
    cache_dtype: torch.dtype | None = None  # d/k rings; None: the state's dtype
    input_dtype: torch.dtype = torch.float32  # mixed_qkv, a, b, out
    l2norm: bool = True
    lower_bound: float | None = None
    force_flush_prob: float = 0.15
    # If set: forced flushes exactly at these (step, slot) pairs instead of at random.
    forced_at: tuple[tuple[int, int], ...] = ()
    padding_rows: int = 1
    seed: int = 0

    @property
    def ring_dtype(self) -> torch.dtype:
        return self.state_dtype if self.cache_dtype is None else self.cache_dtype

    @property
    def width(self) -> int:
        return 2 * self.num_heads * self.head_k_dim + self.num_value_heads * self.head_v_dim

    def with_(self, **changes: object) -> Case:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass
class Pool:
    """A state pool: checkpoint state and the three rings."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.state, self.d_cache, self.k_cache, self.g_cache

    def clone(self) -> Pool:
        return Pool(*(t.clone() for t in self.tensors()))

    def to(self, state_dtype: torch.dtype, ring_dtype: torch.dtype) -> Pool:
        return Pool(
            self.state.to(state_dtype),
            self.d_cache.to(ring_dtype),
            self.k_cache.to(ring_dtype),
            self.g_cache.to(torch.float64 if ring_dtype == torch.float64 else torch.float32),
        )


def make_pool(case: Case, device: str | torch.device = "cpu") -> Pool:
    """A pool with a random checkpoint and random (stale) rings: stale rows must never leak."""
    gen = torch.Generator().manual_seed(case.seed + 1000)
    S, H, HV = case.slots, case.num_heads, case.num_value_heads
    K, V, L = case.head_k_dim, case.head_v_dim, case.ring_len
    state = 0.1 * torch.randn(S, HV, V, K, generator=gen)
    d = torch.randn(S, HV, L, V, generator=gen)
    k = torch.randn(S, H, L, K, generator=gen)
    g = -torch.rand(S, HV, L, K, generator=gen)
    pool = Pool(state, d, k, g).to(case.state_dtype, case.ring_dtype)
    return Pool(*(t.to(device) for t in pool.tensors()))


@dataclass
class Step:
    """The per-token inputs of one decode step (shared by every implementation)."""

    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float
    ssm_state_indices: torch.Tensor
    force_flush: torch.Tensor | None
    extra: dict[str, object] = field(default_factory=dict)

    def cast(self, dtype: torch.dtype) -> Step:
        """The same step with the activations in ``dtype`` (parameters stay as they are)."""
        return replace(
            self,
            mixed_qkv=self.mixed_qkv.to(dtype),
            a=self.a.to(dtype),
            b=self.b.to(dtype),
        )


def make_params(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log spread so per-step decays range from ~0.98 to ~0.2: the ring's prefix sums matter."""
    HV, K = case.num_value_heads, case.head_k_dim
    A_log = torch.linspace(-4.0, 0.5, HV) + 0.1 * torch.randn(HV, generator=gen)
    dt_bias = 0.5 * torch.randn(HV, K, generator=gen)
    return A_log, dt_bias


def make_step(
    case: Case,
    gen: torch.Generator,
    slots_in_batch: torch.Tensor,
    params: tuple[torch.Tensor, torch.Tensor],
    force_flush: bool = True,
) -> Step:
    B, H, K = case.batch, case.num_heads, case.head_k_dim
    mixed = torch.randn(B, case.width, generator=gen)
    if not case.l2norm:
        # Without the in-kernel L2 norm keep |k| ~ 1 so the delta rule stays contractive.
        mixed[:, : 2 * H * K] /= math.sqrt(K)
    ff = None
    if force_flush:
        ff = (torch.rand(B, generator=gen) < case.force_flush_prob).to(torch.int32)
    step = Step(
        mixed_qkv=mixed,
        a=torch.randn(B, case.num_value_heads, K, generator=gen),
        b=torch.randn(B, case.num_value_heads, generator=gen),
        A_log=params[0],
        dt_bias=params[1],
        scale=K**-0.5,
        ssm_state_indices=slots_in_batch.to(torch.int32),
        force_flush=ff,
    )
    return step.cast(case.input_dtype)


def batch_slots(case: Case, gen: torch.Generator) -> torch.Tensor:
    """A random choice of distinct slots for the batch, ``padding_rows`` of them -1."""
    perm = torch.randperm(case.slots, generator=gen)[: case.batch].to(torch.int32)
    perm[torch.randperm(case.batch, generator=gen)[: case.padding_rows]] = -1
    return perm


def run_kernel(
    step: Step, pool: Pool, write_pos: torch.Tensor, out_dtype: torch.dtype, case: Case
) -> torch.Tensor:
    out = torch.full(
        (case.batch, 1, case.num_value_heads, case.head_v_dim),
        float("nan"),
        dtype=out_dtype,
        device=pool.state.device,
    )
    replayssm_decode(
        step.mixed_qkv,
        step.a,
        step.b,
        step.A_log,
        step.dt_bias,
        step.scale,
        *pool.tensors(),
        out,
        step.ssm_state_indices,
        write_pos,
        step.force_flush,
        case.l2norm,
        case.lower_bound,
    )
    return out


def run_replay_reference(
    step: Step, pool: Pool, write_pos: torch.Tensor, out_dtype: torch.dtype, case: Case
) -> torch.Tensor:
    out = torch.full(
        (case.batch, 1, case.num_value_heads, case.head_v_dim), float("nan"), dtype=out_dtype
    )
    replayssm_decode_reference(
        step.mixed_qkv,
        step.a,
        step.b,
        step.A_log,
        step.dt_bias,
        step.scale,
        *pool.tensors(),
        out,
        step.ssm_state_indices,
        write_pos,
        step.force_flush,
        case.l2norm,
        case.lower_bound,
    )
    return out


def run_plain(step: Step, state: torch.Tensor, case: Case) -> torch.Tensor:
    out = torch.full(
        (case.batch, 1, case.num_value_heads, case.head_v_dim),
        float("nan"),
        dtype=state.dtype,
    )
    recurrent_decode_reference(
        step.mixed_qkv,
        step.a,
        step.b,
        step.A_log,
        step.dt_bias,
        step.scale,
        state,
        out,
        step.ssm_state_indices,
        case.l2norm,
        case.lower_bound,
    )
    return out


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ||x - ref|| / ||ref|| in float64; NaN never passes."""
    x64, ref64 = x.double().cpu(), ref.double().cpu()
    if not torch.isfinite(x64).all():
        return math.inf
    return float((x64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


def cursors_for(cursor_by_slot: torch.Tensor, slots_in_batch: torch.Tensor) -> torch.Tensor:
    """Per-row cursors from per-slot cursors (padding rows get an arbitrary in-range 0)."""
    safe = slots_in_batch.clamp_min(0).long()
    return torch.where(slots_in_batch >= 0, cursor_by_slot[safe], 0).to(torch.int32)


def advance_slots(
    cursor_by_slot: torch.Tensor, step: Step, write_pos: torch.Tensor, ring_len: int
) -> None:
    nxt = next_write_pos(write_pos, ring_len, step.force_flush)
    for row, slot in enumerate(step.ssm_state_indices.tolist()):
        if slot >= 0:
            cursor_by_slot[slot] = nxt[row]
