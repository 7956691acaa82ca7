"""Reference (pure torch) ops for Kimi Delta Attention decode with ReplaySSM caches.

``fused_recurrent_kda_replayssm_decode`` follows the argument order of the sglang kernel so the
rollout engine and the trainer can share call sites; it computes in float32 and writes its results
back into the given tensors with ``copy_``, whatever their dtype.
"""

from typing import Optional

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, lower_bound: Optional[float] = None
) -> torch.Tensor:
    """Per-channel log-decay ``g`` ([B, HV, K], float32) from the gate projection ``a``."""
    num_v_heads = A_log.shape[0]
    x = a.float().reshape(a.shape[0], num_v_heads, -1) + dt_bias.float().reshape(num_v_heads, -1)
    A = A_log.float().exp().view(1, num_v_heads, 1)
    if lower_bound is None:
        return -A * F.softplus(x, beta=1.0, threshold=20.0)
    return lower_bound * torch.sigmoid(A * x)


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
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
):
    """One decode token per row. Returns ``(out, initial_state)``; ``write_pos`` is read only."""
    batch = mixed_qkv.shape[0]
    _, num_v_heads, head_v_dim, head_k_dim = initial_state.shape
    num_heads = k_cache.shape[1]
    ring_len = g_cache.shape[2]
    if num_v_heads % num_heads:
        raise ValueError(f"k_cache: {num_heads} key heads do not divide {num_v_heads} value heads")
    if mixed_qkv.shape[-1] != 2 * num_heads * head_k_dim + num_v_heads * head_v_dim:
        raise ValueError(f"mixed_qkv: expected width {2 * num_heads * head_k_dim + num_v_heads * head_v_dim}, got {mixed_qkv.shape[-1]}")
    group = num_v_heads // num_heads

    x = mixed_qkv.float()
    qk_width = num_heads * head_k_dim
    q = x[:, :qk_width].reshape(batch, num_heads, head_k_dim)
    k = x[:, qk_width : 2 * qk_width].reshape(batch, num_heads, head_k_dim)
    v = x[:, 2 * qk_width :].reshape(batch, num_v_heads, head_v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q_scaled = q * scale
    g = kda_gate(a, dt_bias, A_log, lower_bound)
    alpha = g.exp()
    beta = torch.sigmoid(b).float()

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row, 0].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        for hv in range(num_v_heads):
            h = hv // group
            rows = g_cache[slot, hv, :cursor].float()
            total = rows.sum(dim=0)
            state = initial_state[slot, hv].float() * total.exp()[None, :]
            if cursor:
                weights = (total[None, :] - rows.cumsum(dim=0)).exp() * k_cache[slot, h, :cursor].float()
                state = state + d_cache[slot, hv, :cursor].float().transpose(0, 1) @ weights
            decay = alpha[row, hv]
            k_row, q_row = k[row, h], q_scaled[row, h]
            state_q = state @ (decay * q_row)
            state_k = state @ (decay * k_row)
            delta = beta[row, hv] * (v[row, hv] - state_k)
            out[row, 0, hv].copy_(state_q + delta * (k_row @ q_row))
            if flush:
                initial_state[slot, hv].copy_(state * decay[None, :] + delta[:, None] * k_row[None, :])
            else:
                d_cache[slot, hv, cursor].copy_(delta)
                g_cache[slot, hv, cursor].copy_(g[row, hv])
                if hv % group == 0:
                    k_cache[slot, h, cursor].copy_(k_row)
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The cursors after one decode step: 0 after a flush, else one row further (int32)."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)
