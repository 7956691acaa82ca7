"""Pure-torch ReplaySSM decode for Kimi Delta Attention.

``fused_recurrent_kda_replayssm_decode`` takes the arguments of the serving stack's fused kernel,
in the same order. Every input is read in float32; results are written back into the caller's
``out``, ``initial_state`` and ring tensors with ``copy_``, so any storage dtype is accepted.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_log_decay(a, A_log, dt_bias, lower_bound: Optional[float] = None) -> torch.Tensor:
    """Per-channel log-decay ``g`` of one step, in float32; ``a`` is ``[..., HV, K]``."""
    x = a.float() + dt_bias.float().reshape(a.shape[-2:])
    A = A_log.float().exp()[:, None]
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    return -A * F.softplus(x)


def advance_write_pos(write_pos: torch.Tensor, ring_len: int, force_flush=None) -> torch.Tensor:
    """Cursor after one step: 0 after a flush (ring full or forced), else one row further."""
    flush = write_pos == ring_len - 1
    if force_flush is not None:
        flush = flush | (force_flush != 0)
    return torch.where(flush, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)


@torch.no_grad()
def fused_recurrent_kda_replayssm_decode(
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
    force_flush=None,
    use_qk_l2norm_in_kernel=True,
    lower_bound=None,
):
    """One decode token per row: rebuilds each slot's state from its checkpoint and ring rows,
    writes the output, and either appends a ring row or (on a flush) writes a new checkpoint.

    ``write_pos`` is read only; the caller advances it (see ``advance_write_pos``).
    Returns ``(out, initial_state)``.
    """
    batch = mixed_qkv.shape[0]
    _, num_v_heads, head_v_dim, head_k_dim = initial_state.shape
    num_heads, ring_len = k_cache.shape[1], g_cache.shape[2]
    heads = torch.arange(num_v_heads) // (num_v_heads // num_heads)
    H, K = num_heads, head_k_dim

    qkv = mixed_qkv.float()
    q_all = qkv[:, : H * K].reshape(batch, H, K)
    k_all = qkv[:, H * K : 2 * H * K].reshape(batch, H, K)
    v_all = qkv[:, 2 * H * K :].reshape(batch, num_v_heads, head_v_dim)
    if use_qk_l2norm_in_kernel:
        q_all, k_all = l2norm(q_all), l2norm(k_all)
    g_all = kda_log_decay(a.reshape(batch, num_v_heads, K), A_log, dt_bias, lower_bound)
    beta_all = torch.sigmoid(b).to(b.dtype).float()

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        q = q_all[row, heads] * scale
        k = k_all[row, heads]
        g = g_all[row]
        alpha = g.exp()

        rows = g_cache[slot, :, :cursor].float()
        prefix = rows.cumsum(1)
        total = rows.sum(1)
        state = initial_state[slot].float() * total.exp()[:, None, :]
        if cursor:
            decay = (total[:, None, :] - prefix).exp() * k_cache[slot, heads, :cursor].float()
            state = state + torch.einsum("hcv,hck->hvk", d_cache[slot, :, :cursor].float(), decay)

        state_q = torch.einsum("hvk,hk->hv", state, alpha * q)
        state_k = torch.einsum("hvk,hk->hv", state, alpha * k)
        delta = beta_all[row][:, None] * (v_all[row] - state_k)
        out[row, 0].copy_(state_q + delta * (k * q).sum(-1, keepdim=True))
        if flush:
            initial_state[slot].copy_(state * alpha[:, None, :] + delta[:, :, None] * k[:, None, :])
        else:
            d_cache[slot, :, cursor].copy_(delta)
            g_cache[slot, :, cursor].copy_(g)
            k_cache[slot, :, cursor].copy_(k_all[row])
    return out, initial_state
