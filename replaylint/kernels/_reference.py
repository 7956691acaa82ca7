"""Plain-PyTorch references for one KDA decode step: the oracle the kernel is tested against.

Two functions, written for reading rather than speed (a Python loop over rows, ``.item()`` on
indices, so they synchronise on GPU):

* :func:`replayssm_decode_reference` — the ReplaySSM step, argument for argument the kernel's
  contract: rebuild the state from the checkpoint and the ring, emit the output, then either
  append one ring row or, at a flush, fold everything back into the checkpoint.
* :func:`recurrent_decode_reference` — the plain KDA recurrence on a full state per slot. N
  ReplaySSM steps equal N plain steps up to rounding, for any mix of flushes.

Arithmetic runs in float32, or in float64 when any of the state, caches or inputs is float64 —
pass float64 tensors to get a high-precision oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replaylint.kernels._validate import (
    DecodeArgs,
    DecodeShapes,
    RecurrentArgs,
    TokenArgs,
    validate_decode_args,
    validate_recurrent_args,
)

__all__ = ["recurrent_decode_reference", "replayssm_decode_reference"]

L2_NORM_EPS = 1e-6


@dataclass(frozen=True)
class _TokenInputs:
    """What one token contributes, per value head, in the compute dtype."""

    q_scaled: torch.Tensor  # [HV, K]   scale * q (after the optional L2 norm)
    k: torch.Tensor  # [HV, K]          key (after the optional L2 norm), repeated for GQA
    k_per_key_head: torch.Tensor  # [H, K] the same key, once per key head (ring layout)
    v: torch.Tensor  # [HV, V]
    g: torch.Tensor  # [HV, K]          per-channel log-decay, <= 0
    beta: torch.Tensor  # [HV]          write strength in (0, 1)


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_NORM_EPS)


def _token_inputs(
    row: int, args: TokenArgs, shapes: DecodeShapes, dtype: torch.dtype
) -> _TokenInputs:
    """Unpack row ``row`` of the packed projections and compute its gate and beta."""
    H, HV = shapes.num_heads, shapes.num_value_heads
    K, V = shapes.head_k_dim, shapes.head_v_dim
    packed = args.mixed_qkv[row].to(dtype)
    q = packed[: H * K].reshape(H, K)
    k = packed[H * K : 2 * H * K].reshape(H, K)
    v = packed[2 * H * K :].reshape(HV, V)
    if args.use_qk_l2norm_in_kernel:
        q, k = _l2_normalize(q), _l2_normalize(k)
    group = HV // H  # value head hv reads key head hv // group
    q_scaled = (q * float(args.scale)).repeat_interleave(group, dim=0)

    x = args.a[row].reshape(HV, K).to(dtype) + args.dt_bias.reshape(HV, K).to(dtype)
    A = torch.exp(args.A_log.to(dtype))[:, None]
    lower_bound = args.lower_bound
    if lower_bound is None:  # noqa: SIM108 (the two gates read best side by side)
        g = -A * F.softplus(x)  # softplus(x) = x for x > 20, as the contract says
    else:
        g = lower_bound * torch.sigmoid(A * x)
    # beta is rounded through b's dtype before use, as sglang does.
    b = args.b
    beta = torch.sigmoid(b[row].to(dtype)).to(b.dtype).to(dtype)
    return _TokenInputs(
        q_scaled=q_scaled,
        k=k.repeat_interleave(group, dim=0),
        k_per_key_head=k,
        v=v,
        g=g,
        beta=beta,
    )


def _row_slot(ssm_state_indices: torch.Tensor, row: int, slots: int) -> int | None:
    """The pool slot of ``row``, or None for a padding row (negative or out-of-range index)."""
    slot = int(ssm_state_indices[row].item())
    return slot if 0 <= slot < slots else None


def replayssm_decode_reference(
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
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM KDA decode step in plain PyTorch (same signature as the kernel).

    Per row ``b`` with ``slot = ssm_state_indices[b]`` and cursor ``c = write_pos[b]``:

    1. Padding (``slot < 0``, or ``slot >= slots``): ``out[b] = 0``; nothing else is touched.
    2. Rebuild the state from the checkpoint ``S0`` and the ``c`` ring rows before the cursor,
       with ``G_j`` the prefix sums of the stored log-decays::

           S = S0 * exp(G_T) + sum_{j<c} d_j (x) (exp(G_T - G_j) * k_j)

    3. Output: ``delta = beta * (v - S @ (alpha * k))``,
       ``out = S @ (alpha * q_s) + delta * (k . q_s)`` with ``alpha = exp(g)``.
    4. A flush (``c == L - 1`` or ``force_flush[b] != 0``) writes
       ``S * alpha + delta (x) k`` into the checkpoint; otherwise ring row ``c`` receives
       ``delta`` (d_cache), ``g`` (g_cache) and the normalised key (k_cache, per key head).

    Cursors outside ``[0, L)`` are clamped into it, exactly as the kernel does. The caller
    advances the cursors (see :func:`replaylint.kernels.next_write_pos`).
    Returns ``(out, initial_state)``.
    """
    args = DecodeArgs(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        scale,
        initial_state,
        d_cache,
        k_cache,
        g_cache,
        out,
        ssm_state_indices,
        write_pos,
        force_flush,
        use_qk_l2norm_in_kernel,
        lower_bound,
    )
    shapes = validate_decode_args(args, reference=True).shapes
    dtype = _compute_dtype(mixed_qkv, initial_state, d_cache, k_cache, g_cache)
    L = shapes.ring_len
    group = shapes.num_value_heads // shapes.num_heads
    for row in range(shapes.batch):
        slot = _row_slot(ssm_state_indices, row, shapes.slots)
        if slot is None:
            out[row].zero_()
            continue
        t = _token_inputs(row, args, shapes, dtype)
        c = min(max(int(write_pos[row].item()), 0), L - 1)
        flush = c == L - 1 or (force_flush is not None and int(force_flush[row].item()) != 0)

        # 2. Rebuild S [HV, V, K] from the checkpoint and ring rows 0..c-1.
        S0 = initial_state[slot].to(dtype)
        g_rows = g_cache[slot, :, :c].to(dtype)  # [HV, c, K]
        G = torch.cumsum(g_rows, dim=1)  # G_j
        G_T = g_rows.sum(dim=1)  # [HV, K]
        k_rows = k_cache[slot, :, :c].to(dtype).repeat_interleave(group, dim=0)  # [HV, c, K]
        d_rows = d_cache[slot, :, :c].to(dtype)  # [HV, c, V]
        decayed_keys = torch.exp(G_T[:, None, :] - G) * k_rows
        S = S0 * torch.exp(G_T)[:, None, :] + torch.einsum("hjv,hjk->hvk", d_rows, decayed_keys)

        # 3. Output (S @ x for x = alpha * q_s and alpha * k).
        alpha = torch.exp(t.g)
        state_q = torch.einsum("hvk,hk->hv", S, alpha * t.q_scaled)
        state_k = torch.einsum("hvk,hk->hv", S, alpha * t.k)
        delta = t.beta[:, None] * (t.v - state_k)
        kq = (t.k * t.q_scaled).sum(-1, keepdim=True)
        out[row, 0] = (state_q + delta * kq).to(out.dtype)

        # 4. Fold into the checkpoint at a flush; otherwise append ring row c.
        if flush:
            S_new = S * alpha[:, None, :] + delta[:, :, None] * t.k[:, None, :]
            initial_state[slot] = S_new.to(initial_state.dtype)
        else:
            d_cache[slot, :, c] = delta.to(d_cache.dtype)
            g_cache[slot, :, c] = t.g.to(g_cache.dtype)
            k_cache[slot, :, c] = t.k_per_key_head.to(k_cache.dtype)
    return out, initial_state


def recurrent_decode_reference(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One plain KDA decode step on a full state ``state[slots, HV, V, K]`` (updated in place).

    Per row with ``slot = ssm_state_indices[b]`` (padding rows as in the replay step)::

        S = state[slot] * alpha                  # decay every key channel
        delta = beta * (v - S @ k)               # delta rule
        S = S + delta (x) k;  out = S @ q_s      # write, then read

    H is read off ``mixed_qkv``'s width. Returns ``(out, state)``.
    """
    args = RecurrentArgs(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        scale,
        state,
        out,
        ssm_state_indices,
        use_qk_l2norm_in_kernel,
        lower_bound,
    )
    shapes = validate_recurrent_args(args)
    dtype = _compute_dtype(mixed_qkv, state)
    for row in range(shapes.batch):
        slot = _row_slot(ssm_state_indices, row, shapes.slots)
        if slot is None:
            out[row].zero_()
            continue
        t = _token_inputs(row, args, shapes, dtype)
        S = state[slot].to(dtype) * torch.exp(t.g)[:, None, :]
        delta = t.beta[:, None] * (t.v - torch.einsum("hvk,hk->hv", S, t.k))
        S = S + delta[:, :, None] * t.k[:, None, :]
        out[row, 0] = torch.einsum("hvk,hk->hv", S, t.q_scaled).to(out.dtype)
        state[slot] = S.to(state.dtype)
    return out, state
