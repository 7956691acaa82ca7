"""The Helion ReplaySSM KDA decode kernel body, the cursor-step kernel, and their instances.

Importing this module imports helion (several seconds); :mod:`replaylint.kernels` imports it
lazily, on the first kernel call.

One program per (V slice, value head hv, row b), one warp each (two for the smallest launches;
the configs in ``_configs.py``): the value dimension is split into ``NS`` slices of ``BVs = V / NS`` rows, so a
launch has ``NS * HV * B`` programs (8 / 4 / 2 slices for small launches, 1 at large B, where the
K-side work below, repeated per slice, costs more than the extra programs gain). The V slice is
the fastest-varying grid index, so the programs of one (row, head) run side by side and share
their ring reads through L2. In each program:

1. scalars and K-vectors: cursor, flush flag; q, k (optionally L2-normalised), the gate g,
   alpha = exp(g), beta;
2. the ring's K side: the live g rows (j < c) and k rows, their prefix sums and the decayed
   keys ``W_j = exp(G_T - G_j) * k_j`` (one exp per ring row and channel), folded with
   ``alpha * q_s`` and ``alpha * k`` into two length-L weight vectors;
3. a loop over the slice's V tiles: each reads its rows of the checkpoint S0 and of the live
   d rows once and computes ``S @ x = S0 @ (exp(G_T) * x) + D^T (W @ x)`` without forming S,
   writes ``out``, and then either appends the d row or, in the 1 program in L that flushes,
   writes the tile's S_new from the values already loaded (its ring term ``D^T (W * alpha)``
   as one matrix product per tile, or row by row over the ring).

A step runs in one launch (``phase`` ALL_ROWS) or in two (APPEND_ROWS, then FLUSH_ROWS): each
of those compiles only its own branch of step 3, so the append pass keeps none of the flush's
registers live (151 instead of 220 per thread for bf16 state, by ncu) and more of its programs
fit on an SM; in each pass the programs of the other kind of row exit after reading the cursor.

All arithmetic is float32 whatever the storage dtypes.
"""

from __future__ import annotations

import functools
from typing import Any

import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import RefMode

from replaylint.kernels._configs import (
    APPEND_ROWS,
    FLUSH_ROWS,
    ConfigKey,
    config_from_key,
)

__all__ = [
    "compiled_cursor_step",
    "compiled_kernel",
    "interpreted_cursor_step",
    "interpreted_kernel",
]


def replayssm_decode_body(
    q: torch.Tensor,  # [B, H, K]  views into mixed_qkv
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, HV, NS, BVs]
    a: torch.Tensor,  # [B, HV, K]
    b: torch.Tensor,  # [B, HV]
    A_log: torch.Tensor,  # [HV]
    dt_bias: torch.Tensor,  # [HV, K]
    state: torch.Tensor,  # [slots, HV, NS, BVs, K]
    d_cache: torch.Tensor,  # [slots, HV, L, NS, BVs]
    k_cache: torch.Tensor,  # [slots, H, L, K]
    g_cache: torch.Tensor,  # [slots, HV, L, K]
    out: torch.Tensor,  # [B, HV, NS, BVs]
    slot_idx: torch.Tensor,  # [B] int32
    write_pos: torch.Tensor,  # [B] int32
    force_flush: torch.Tensor,  # [B] int32 (read only when has_force_flush)
    scale: float,
    lower_bound: float,  # used only when bounded
    use_l2: hl.constexpr,
    bounded: hl.constexpr,
    has_force_flush: hl.constexpr,
    slot_dtype: hl.constexpr,  # torch.int64 when offsets pass int32 (huge pool views)
    flush_by_dot: hl.constexpr,  # the flush's ring term as one matrix product per V tile
    phase: hl.constexpr,  # ALL_ROWS, or APPEND_ROWS / FLUSH_ROWS for a launch in two passes
    interpret: hl.constexpr,
) -> None:
    B = q.size(0)
    H = hl.specialize(q.size(1))
    K = hl.specialize(q.size(2))
    HV = hl.specialize(v.size(1))
    NS = hl.specialize(v.size(2))
    BVs = hl.specialize(v.size(3))
    L = hl.specialize(d_cache.size(2))
    num_slots = state.size(0)
    group = HV // H
    block_v = hl.register_block_size(BVs)
    for vs, hv, bi in hl.grid([NS, HV, B]):
        slot = slot_idx[bi].to(slot_dtype)  # so slot * slot_stride cannot wrap
        # Padding rows (negative index) and indices past the pool touch nothing.
        valid = (slot >= 0) & (slot < num_slots)
        # Clamp the cursor so a stale or corrupt write_pos can never address memory outside
        # the ring; c >= L - 1 flushes.
        c = torch.clamp(write_pos[bi], 0, L - 1)
        flush = c == L - 1
        appends = c != L - 1
        if has_force_flush:
            flush = flush | (force_flush[bi] != 0)
            appends = appends & (force_flush[bi] == 0)
        # A launch in two passes runs the appending rows in one and the flushing rows in the
        # other: each pass compiles only its branch, so the append pass keeps none of the
        # flush's registers live and more of its programs fit on an SM.
        if phase == APPEND_ROWS:
            mine = valid & appends
        elif phase == FLUSH_ROWS:
            mine = valid & flush
        else:
            mine = valid
        if mine:
            h = hv // group

            # 1. The token: q, k (full K), the gate and beta.
            qv = q[bi, h, :].to(torch.float32)
            kv = k[bi, h, :].to(torch.float32)
            if use_l2:
                qv = qv * torch.rsqrt(torch.sum(qv * qv, -1) + 1e-6)
                kv = kv * torch.rsqrt(torch.sum(kv * kv, -1) + 1e-6)
            qs = qv * scale
            x = a[bi, hv, :].to(torch.float32) + dt_bias[hv, :].to(torch.float32)
            A = torch.exp(A_log[hv].to(torch.float32))
            if bounded:
                g = lower_bound * torch.sigmoid(A * x)
            else:
                g = -A * torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
            alpha = torch.exp(g)
            b_val = b[bi, hv]
            beta = torch.sigmoid(b_val.to(torch.float32)).to(b_val.dtype).to(torch.float32)

            # 2. The ring's K side, once per program. Rows j >= c are masked off the loads, so
            #    they cost no bandwidth and stale values in them are never read.
            rows = hl.arange(L)
            live = rows < c
            live_k = live[:, None] & (hl.arange(K)[None, :] >= 0)
            g_ring = hl.load(g_cache, [slot, hv, slice(None), slice(None)], extra_mask=live_k)
            g_prefix = hl.cumsum(g_ring, 0)  # G_j
            g_total = torch.sum(g_ring, 0)  # G_T
            k_ring = hl.load(k_cache, [slot, h, slice(None), slice(None)], extra_mask=live_k)
            decay = torch.where(live[:, None], torch.exp(g_total[None, :] - g_prefix), 0.0)
            w = decay * k_ring.to(torch.float32)  # W_j = exp(G_T - G_j) * k_j   [L, K]
            aq = alpha * qs
            ak = alpha * kv
            e_total = torch.exp(g_total)
            u_q = e_total * aq  # S0 @ u_q is S0's part of S @ (alpha * q_s)
            u_k = e_total * ak
            w_q = torch.sum(w * aq[None, :], 1)  # the ring's part, per ring row   [L]
            w_k = torch.sum(w * ak[None, :], 1)
            kq = torch.sum(kv * qs, -1)

            # 3. This program's V slice in tiles: read S0 and the live d rows once and emit
            #    out; then either append the d row or, in the 1 program in L that flushes,
            #    write S_new for the tile from the values already loaded (S0 is read once per
            #    step whether the row flushes or not). S0 is streamed, so its lines are marked
            #    first for eviction from L2.
            # For the flush's rank-c update D^T [BV, L] @ (W * alpha) [L, K] as one matrix
            # product per tile (rows j >= c of W are zero); unused (and dropped by the
            # compiler) when the flush walks the ring row by row or the pass only appends.
            w_alpha = w * alpha[None, :]
            e_alpha = e_total * alpha
            for tv in hl.tile(BVs, block_size=block_v):
                if interpret:  # (the interpreter's hl.load mishandles this index mix)
                    s0 = state[slot, hv, vs, tv, :].to(torch.float32)
                else:
                    s0 = hl.load(
                        state, [slot, hv, vs, tv, slice(None)], eviction_policy="evict_first"
                    ).to(torch.float32)  # [BV, K]
                if interpret:
                    # Same values; the interpreter's masked load does not take this index mix.
                    d_ring = torch.where(
                        live[:, None], d_cache[slot, hv, :, vs, tv].to(torch.float32), 0.0
                    )
                else:
                    d_ring = hl.load(
                        d_cache,
                        [slot, hv, slice(None), vs, tv],
                        extra_mask=live[:, None] & (tv.index[None, :] >= 0),
                    ).to(torch.float32)  # [L, BV]
                state_q = torch.sum(s0 * u_q[None, :], 1) + torch.sum(d_ring * w_q[:, None], 0)
                state_k = torch.sum(s0 * u_k[None, :], 1) + torch.sum(d_ring * w_k[:, None], 0)
                delta = beta * (v[bi, hv, vs, tv].to(torch.float32) - state_k)
                out[bi, hv, vs, tv] = (state_q + delta * kq).to(out.dtype)
                if phase != APPEND_ROWS:  # noqa: SIM102 (in a flush pass, every row flushes)
                    if flush:
                        # S_new = S0 * (exp(G_T) * alpha) + sum_j d_j (x) (W_j * alpha)
                        #         + delta (x) k
                        s_new = s0 * e_alpha[None, :] + delta[:, None] * kv[None, :]
                        if flush_by_dot:
                            if interpret:  # (the interpreter's hl.dot has no CPU fp32 path)
                                s_new = s_new + torch.matmul(torch.transpose(d_ring, 0, 1), w_alpha)
                            else:
                                s_new = hl.dot(torch.transpose(d_ring, 0, 1), w_alpha, acc=s_new)
                        else:
                            # Row by row over the live ring rows (any tile or ring size).
                            g_run = hl.zeros([K], dtype=torch.float32)
                            for j in hl.grid(c):
                                g_run = g_run + g_cache[slot, hv, j, :].to(torch.float32)
                                w_j = torch.exp(g_total - g_run) * k_cache[slot, h, j, :].to(
                                    torch.float32
                                )
                                d_j = d_cache[slot, hv, j, vs, tv].to(torch.float32)
                                s_new = s_new + d_j[:, None] * (w_j * alpha)[None, :]
                        state[slot, hv, vs, tv, :] = s_new.to(state.dtype)
                if phase != FLUSH_ROWS:  # noqa: SIM102 (device branches, nested as Helion traces them)
                    if not flush:
                        d_cache[slot, hv, c, vs, tv] = delta.to(d_cache.dtype)
            if phase != FLUSH_ROWS:  # noqa: SIM102
                if not flush:  # noqa: SIM102
                    if vs == 0:  # one writer per (row, head) for the K-side rows
                        g_cache[slot, hv, c, :] = g.to(g_cache.dtype)
                        if hv % group == 0:  # and one per key head under GQA
                            k_cache[slot, h, c, :] = kv.to(k_cache.dtype)
        if phase != FLUSH_ROWS:  # noqa: SIM102 (padding rows get a zero output, once)
            if not valid:
                for tv_pad in hl.tile(BVs, block_size=block_v):
                    out[bi, hv, vs, tv_pad] = hl.zeros([tv_pad], dtype=out.dtype)


def cursor_step_body(
    cursors: torch.Tensor,  # [slots] int32, the pool's cursors (advanced in place)
    slot_idx: torch.Tensor,  # [B] int32
    force_flush: torch.Tensor,  # [B] int32 (read only when has_force_flush)
    write_pos: torch.Tensor,  # [B] int32, out: each row's cursor for this step
    ring_len: int,
    has_force_flush: hl.constexpr,
) -> None:
    """Gather each row's cursor into ``write_pos`` and advance the pool's cursor, in one launch.

    Runs before the decode kernel, which reads only ``write_pos``; so the in-place advance
    cannot race with it. Padding rows get cursor 0 and move nothing.
    """
    B = slot_idx.size(0)
    num_slots = cursors.size(0)
    for bi in hl.grid(B):
        slot = slot_idx[bi]
        if (slot >= 0) & (slot < num_slots):
            pos = cursors[slot]
            c = torch.clamp(pos, 0, ring_len - 1)
            flush = c == ring_len - 1
            if has_force_flush:
                flush = flush | (force_flush[bi] != 0)
            write_pos[bi] = pos
            cursors[slot] = torch.where(flush, 0, c + 1).to(cursors.dtype)
        else:
            write_pos[bi] = 0


# Shapes stay dynamic: one compile serves every batch size and pool stride (head counts and
# head/ring sizes and the V split are specialised inside the body).
_SETTINGS: dict[str, Any] = {"static_shapes": False}


@functools.cache
def compiled_kernel(config: ConfigKey, index_dtype: torch.dtype, dot_precision: str) -> Any:
    """The compiled (Triton) decode kernel for one fixed config; never autotunes.

    ``dot_precision`` is the float32 matrix-product precision of the flush's ring term
    ("tf32x3": three tf32 tensor-core products, near float32 accuracy; "ieee": exact float32
    multiply-adds)."""
    return helion.kernel(
        replayssm_decode_body,
        config=helion.Config(**config_from_key(config)),
        ref_mode=RefMode.OFF,
        index_dtype=index_dtype,
        dot_precision=dot_precision,
        **_SETTINGS,
    )


@functools.cache
def interpreted_kernel(block_v: int, dot_precision: str) -> Any:
    """The same body run eagerly by Helion's interpreter (``RefMode.EAGER``), for CPU tensors."""
    return helion.kernel(
        replayssm_decode_body,
        config=helion.Config(block_sizes=[block_v]),
        ref_mode=RefMode.EAGER,
        dot_precision=dot_precision,
        **_SETTINGS,
    )


@functools.cache
def compiled_cursor_step() -> Any:
    """The compiled cursor step (one warp per row: a few bytes each)."""
    return helion.kernel(
        cursor_step_body,
        config=helion.Config(num_warps=1, num_stages=1),
        ref_mode=RefMode.OFF,
        **_SETTINGS,
    )


@functools.cache
def interpreted_cursor_step() -> Any:
    """The cursor step through Helion's interpreter, for CPU tensors."""
    return helion.kernel(
        cursor_step_body, config=helion.Config(), ref_mode=RefMode.EAGER, **_SETTINGS
    )
