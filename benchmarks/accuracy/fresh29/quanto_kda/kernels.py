"""CPU stand-in for the ReplaySSM KDA decode kernel, with sglang's keyword names: updates the
state rows of ``initial_state_indices`` in place, only reads the rings, and keeps the tensors of
the latest call for ``last_inputs()``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_LAST: dict[str, torch.Tensor] = {}


def fused_recurrent_kda_replayssm_decode(
    q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None,
    d_cache=None, k_cache=None, g_cache=None, cache_steps=None, use_qk_l2norm_in_kernel=True, **kwargs: Any
) -> torch.Tensor:
    given = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    _LAST.clear()
    _LAST.update({name: t for name, t in given.items() if t is not None})
    batch, num_v_heads, head_v_dim = v.shape
    rep = num_v_heads // q.shape[1]
    qf, kf = (x.float().repeat_interleave(rep, dim=1) for x in (q, k))
    if use_qk_l2norm_in_kernel:
        qf, kf = F.normalize(qf, dim=-1), F.normalize(kf, dim=-1)
    rows = torch.arange(batch) if initial_state_indices is None else initial_state_indices.long()
    if initial_state is None:
        state = torch.zeros(batch, num_v_heads, head_v_dim, q.shape[-1])
    else:
        state = initial_state[rows].float()
    state = state * g.float().exp()[:, :, None, :]
    state = state + beta.float()[..., None, None] * v.float()[..., None] * kf[:, :, None, :]
    if initial_state is not None:
        initial_state[rows] = state.to(initial_state.dtype)
    out = (state * qf[:, :, None, :]).sum(-1) * (scale or q.shape[-1] ** -0.5)
    return out.to(v.dtype)


def last_inputs() -> dict[str, torch.Tensor]:
    return dict(_LAST)


def new_request_rings(k: torch.Tensor, v: torch.Tensor, ring_length: int) -> dict[str, torch.Tensor]:
    """Empty rings for one request decoded outside a cache (the reference path of the tests)."""
    batch, num_v_heads, head_v_dim = v.shape
    return {
        "d_cache": v.new_zeros(batch, num_v_heads, ring_length, head_v_dim),
        "k_cache": k.new_zeros(batch, k.shape[1], ring_length, k.shape[-1]),
        "g_cache": v.new_zeros(batch, num_v_heads, ring_length, k.shape[-1]),  # expect-bug: like
    }


def decode_once(q, k, v, g, beta, ring_length: int = 4) -> torch.Tensor:
    return fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, **new_request_rings(k, v, ring_length))


class ReplayDecodeRunner:
    """Replays the decode over static ring inputs captured once (CUDA-graph style)."""

    def __init__(self, static_inputs: dict[str, Any]):
        self.static = dict(static_inputs)

    def __call__(self, q, k, v, g, beta) -> torch.Tensor:
        return fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, **self.static)


def build_runner_replay() -> ReplayDecodeRunner:
    slots, heads, ring, dim = 2, 2, 3, 4
    d_cache, k_cache = (torch.zeros(slots, heads, ring, dim, dtype=torch.bfloat16) for _ in range(2))
    runner = ReplayDecodeRunner(dict(
        initial_state=torch.zeros(slots, heads, dim, dim, dtype=torch.float32), initial_state_indices=torch.arange(slots, dtype=torch.int32),
        d_cache=d_cache, k_cache=k_cache, g_cache=torch.zeros(slots, heads, ring, dim, dtype=torch.float32),
    ))
    for _ in range(2):
        q, k, v = (torch.randn(slots, heads, dim, dtype=torch.bfloat16) for _ in range(3))
        runner(q, k, v, -torch.rand(slots, heads, dim), torch.rand(slots, heads, dtype=torch.bfloat16))
    return runner
