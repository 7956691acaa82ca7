# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""CPU reference of the fused ReplaySSM decode step for Kimi Delta Attention (KDA).

The engine and the trainers call :func:`fused_recurrent_kda_replayssm_decode` once per KDA layer
and decode step. Per decode slot it keeps a checkpoint ``initial_state[slot]`` (``[HV, V, K]``)
and three rings holding the last ``L`` steps:

* ``d_cache [slots, HV, L, V]``: the deltas ``beta * (v - S k)``, in the model dtype,
* ``k_cache [slots, H, L, K]``: the L2-normalised keys, in the model dtype,
* ``g_cache [slots, HV, L, K]``: the per-channel log-decays, float32.

The state of a slot is rebuilt from its checkpoint and the rows ``j < write_pos`` of its rings:
the log-decays are prefix-summed and exponentiated, so an absolute error in a stored log-decay
becomes a relative error of every decay after it. When the ring is full, or a flush is forced,
the updated state is written into the checkpoint and the ring starts over.

This module computes in float32 on any device. It accepts rings of any floating dtype and
writes each ring in its own dtype, which is the storage the Triton kernel leaves behind;
:data:`DECODE_CALLS` records the ring dtypes each call was given.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "DECODE_CALLS",
    "advance_write_pos",
    "flush_mask",
    "fused_recurrent_kda_replayssm_decode",
    "kda_log_decay",
    "l2_normalize",
    "recurrent_kda_step",
    "split_mixed_qkv",
]


# (d_cache, k_cache, g_cache) dtypes of recent calls, newest last.
DECODE_CALLS: list[tuple[str, str, str]] = []
_MAX_CALLS = 4096


def _expect_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(tensor.shape)}")


def _expect_int32(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.int32:
        raise ValueError(f"{name}: expected torch.int32, got {tensor.dtype}")


def split_mixed_qkv(
    mixed_qkv: torch.Tensor, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Splits ``[..., 2*H*K + HV*V]`` into ``q, k [..., H, K]`` and ``v [..., HV, V]``."""
    qk_width = num_k_heads * head_k_dim
    q, k, v = mixed_qkv.split([qk_width, qk_width, num_v_heads * head_v_dim], dim=-1)
    return (
        q.unflatten(-1, (num_k_heads, head_k_dim)),
        k.unflatten(-1, (num_k_heads, head_k_dim)),
        v.unflatten(-1, (num_v_heads, head_v_dim)),
    )


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def kda_log_decay(
    a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None = None
) -> torch.Tensor:
    """Per-channel log-decays of KDA, always float32.

    ``g = -exp(A_log) * softplus(a + dt_bias)``, or ``g = lower_bound * sigmoid(exp(A_log) *
    (a + dt_bias))`` for the bounded gate. ``a`` is ``[..., HV * K]`` or ``[..., HV, K]``; the
    result is ``[..., HV, K]``.
    """
    num_v_heads = A_log.shape[0]
    head_k_dim = dt_bias.numel() // num_v_heads
    flat = a.shape[-1] == num_v_heads * head_k_dim and not (
        a.dim() >= 2 and tuple(a.shape[-2:]) == (num_v_heads, head_k_dim)
    )
    lead = a.shape[:-1] if flat else a.shape[:-2]
    x = a.float().reshape(-1, num_v_heads, head_k_dim) + dt_bias.float().reshape(num_v_heads, head_k_dim)
    A = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        g = -A * F.softplus(x)
    else:
        g = lower_bound * torch.sigmoid(A * x)
    return g.reshape(*lead, num_v_heads, head_k_dim)


def flush_mask(
    write_pos: torch.Tensor, ring_len: int, force_flush: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows whose next decode step folds the ring into the checkpoint."""
    flush = write_pos == ring_len - 1
    if force_flush is not None:
        flush = flush | (force_flush != 0)
    return flush


def advance_write_pos(
    cursors: torch.Tensor, ssm_state_indices: torch.Tensor, ring_len: int, force_flush: torch.Tensor | None = None
) -> torch.Tensor:
    """Advances the per-slot ``cursors`` (int32, in place) after one decode step.

    A slot that flushed starts its ring over at 0, any other slot moves on by one row; padded
    rows (``slot < 0``) are left alone. Returns ``cursors``.
    """
    active = ssm_state_indices >= 0
    if not bool(active.any()):
        return cursors
    index = ssm_state_indices[active].long()
    pos = cursors[index]
    force = None if force_flush is None else force_flush[active]
    flushed = flush_mask(pos, ring_len, force)
    cursors[index] = torch.where(flushed, torch.zeros_like(pos), pos + 1).to(torch.int32)
    return cursors


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step of a KDA layer for a batch of single tokens.

    ``write_pos`` holds the ring cursor of each row (not of each slot) and is only read; the
    caller advances its cursors afterwards (:func:`advance_write_pos`). ``out`` is written for
    every row, ``initial_state`` for rows that flush, the rings at the cursor row otherwise.

    Returns:
        ``(out, initial_state)``.
    """
    num_slots, num_v_heads, head_v_dim, head_k_dim = initial_state.shape
    num_k_heads = k_cache.shape[1]
    ring_len = g_cache.shape[2]
    batch = mixed_qkv.shape[0]
    if num_v_heads % num_k_heads:
        raise ValueError(f"k_cache: {num_v_heads} value heads are not a multiple of {num_k_heads}")
    _expect_shape("mixed_qkv", mixed_qkv, (batch, 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim))
    _expect_shape("d_cache", d_cache, (num_slots, num_v_heads, ring_len, head_v_dim))
    _expect_shape("k_cache", k_cache, (num_slots, num_k_heads, ring_len, head_k_dim))
    _expect_shape("g_cache", g_cache, (num_slots, num_v_heads, ring_len, head_k_dim))
    _expect_shape("out", out, (batch, 1, num_v_heads, head_v_dim))
    _expect_shape("ssm_state_indices", ssm_state_indices, (batch,))
    _expect_shape("write_pos", write_pos, (batch,))
    _expect_int32("ssm_state_indices", ssm_state_indices)
    _expect_int32("write_pos", write_pos)
    if force_flush is not None:
        _expect_shape("force_flush", force_flush, (batch,))

    q, k, v = split_mixed_qkv(mixed_qkv.float(), num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    q = q * scale
    g = kda_log_decay(a.reshape(batch, -1), A_log, dt_bias.reshape(-1), lower_bound)
    alpha = g.exp()
    beta = torch.sigmoid(b.float())
    group = num_v_heads // num_k_heads
    flushed = flush_mask(write_pos, ring_len, force_flush)

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        c = int(write_pos[row])
        rows_g = g_cache[slot, :, :c].float()
        cumulative = rows_g.cumsum(dim=1)
        total = cumulative[:, -1] if c else rows_g.new_zeros(num_v_heads, head_k_dim)
        keys = k_cache[slot, :, :c].float().repeat_interleave(group, dim=0)
        deltas = d_cache[slot, :, :c].float()
        state = initial_state[slot].float() * total.exp().unsqueeze(1)
        if c:
            decayed = keys * (total.unsqueeze(1) - cumulative).exp()
            state = state + torch.einsum("hjv,hjk->hvk", deltas, decayed)

        k_row = k[row].repeat_interleave(group, dim=0)
        q_row = q[row].repeat_interleave(group, dim=0)
        state_q = torch.einsum("hvk,hk->hv", state, alpha[row] * q_row)
        state_k = torch.einsum("hvk,hk->hv", state, alpha[row] * k_row)
        delta = beta[row].unsqueeze(-1) * (v[row] - state_k)
        out[row, 0] = (state_q + delta * (k_row * q_row).sum(-1, keepdim=True)).to(out.dtype)
        if bool(flushed[row]):
            new_state = state * alpha[row].unsqueeze(1) + delta.unsqueeze(-1) * k_row.unsqueeze(1)
            initial_state[slot] = new_state.to(initial_state.dtype)
        else:
            d_cache[slot, :, c] = delta.to(d_cache.dtype)
            g_cache[slot, :, c] = g[row].to(g_cache.dtype)
            k_cache[slot, :, c] = k[row].to(k_cache.dtype)

    if len(DECODE_CALLS) < _MAX_CALLS:
        DECODE_CALLS.append((str(d_cache.dtype), str(k_cache.dtype), str(g_cache.dtype)))
    return out, initial_state


def recurrent_kda_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain KDA recurrence for one step, float32, per value head (``[HV, ...]`` inputs).

    ``S <- S * exp(g) + beta * (v - (S * exp(g)) k) k^T``, ``o = S q``. Returns ``(o, S)``.
    """
    decayed = state * g.exp().unsqueeze(1)
    delta = beta.unsqueeze(-1) * (v - torch.einsum("hvk,hk->hv", decayed, k))
    new_state = decayed + delta.unsqueeze(-1) * k.unsqueeze(1)
    return torch.einsum("hvk,hk->hv", new_state, q), new_state


def build_reference_decode() -> dict[str, torch.Tensor]:
    """Six decode steps of two rows against the plain recurrence (one forced flush, one pad)."""
    generator = torch.Generator().manual_seed(1234)
    num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len, num_slots = 1, 2, 4, 4, 3, 3
    width = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    A_log = torch.linspace(0.0, 1.0, num_v_heads)
    dt_bias = torch.zeros(num_v_heads * head_k_dim)
    scale = head_k_dim**-0.5

    initial_state = torch.zeros(num_slots, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32)
    d_cache = torch.zeros(num_slots, num_v_heads, ring_len, head_v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(num_slots, num_k_heads, ring_len, head_k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(num_slots, num_v_heads, ring_len, head_k_dim, dtype=torch.float32)
    cursors = torch.zeros(num_slots, dtype=torch.int32)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    reference = torch.zeros(2, num_v_heads, head_v_dim, head_k_dim)
    errors = []

    for step in range(6):
        mixed_qkv = torch.randn(2, width, generator=generator).to(torch.bfloat16)
        a = torch.randn(2, num_v_heads * head_k_dim, generator=generator)
        b = torch.randn(2, num_v_heads, generator=generator)
        force = torch.tensor([1 if step == 1 else 0, 0], dtype=torch.int32)
        rows = slots if step != 4 else torch.tensor([2, -1], dtype=torch.int32)
        out = torch.empty(2, 1, num_v_heads, head_v_dim, dtype=torch.float32)
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, scale, initial_state=initial_state, d_cache=d_cache,
            k_cache=k_cache, g_cache=g_cache, out=out, ssm_state_indices=rows,
            write_pos=cursors[rows.clamp(min=0).long()], force_flush=force,
        )
        advance_write_pos(cursors, rows, ring_len, force)

        q, k, v = split_mixed_qkv(mixed_qkv.float(), num_k_heads, num_v_heads, head_k_dim, head_v_dim)
        q, k = l2_normalize(q) * scale, l2_normalize(k)
        g = kda_log_decay(a, A_log, dt_bias)
        for row in range(2):
            if int(rows[row]) < 0:
                continue
            o, reference[row] = recurrent_kda_step(
                reference[row],
                q[row].repeat_interleave(num_v_heads, dim=0),
                k[row].repeat_interleave(num_v_heads, dim=0),
                v[row],
                g[row],
                torch.sigmoid(b[row]),
            )
            errors.append((o - out[row, 0]).abs().max())

    return {
        "initial_state": initial_state,
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": g_cache,
        "write_pos": cursors,
        "reference_state": reference,
        "max_abs_err": torch.stack(errors).max(),
    }
