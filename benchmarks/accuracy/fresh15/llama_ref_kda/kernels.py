# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

"""Pure torch version of the ReplaySSM KDA decode kernel.

The argument order follows the fused kernel that serving stacks call, so the model code can
swap one for the other. Everything is computed in float32; results are written back into the
caller's tensors with ``copy_``, whatever their dtypes.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_log_decay(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Per-channel log-decay ``g`` of one step; ``a`` is ``[..., HV, K]``, result in float32."""
    x = a.float() + dt_bias.float().reshape(a.shape[-2:])
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(x, beta=1.0, threshold=20.0)
    return lower_bound * torch.sigmoid(A * x)


def _check(name: str, tensor: torch.Tensor, ndim: int) -> None:
    if tensor.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(tensor.shape)}")


@torch.no_grad()
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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decode token per row.

    Rebuilds each row's state from its checkpoint and the ``write_pos`` rows of its rings,
    produces the output, and either appends the step to the rings or (on a full ring or a
    forced flush) folds it into the checkpoint. ``write_pos`` is only read.
    """
    _check("initial_state", initial_state, 4)
    _check("d_cache", d_cache, 4)
    _check("k_cache", k_cache, 4)
    _check("g_cache", g_cache, 4)
    _, n_v_heads, v_dim, k_dim = initial_state.shape
    n_heads, ring_len = k_cache.shape[1], d_cache.shape[2]
    if tuple(g_cache.shape[1:]) != (n_v_heads, ring_len, k_dim):
        raise ValueError(
            f"g_cache: expected [slots, {n_v_heads}, {ring_len}, {k_dim}], got {tuple(g_cache.shape)}"
        )
    batch = mixed_qkv.shape[0]
    group = n_v_heads // n_heads
    x = mixed_qkv.float()
    q = x[:, : n_heads * k_dim].reshape(batch, n_heads, k_dim)
    k = x[:, n_heads * k_dim : 2 * n_heads * k_dim].reshape(batch, n_heads, k_dim)
    v = x[:, 2 * n_heads * k_dim :].reshape(batch, n_v_heads, v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    g = kda_log_decay(a.reshape(batch, n_v_heads, k_dim), A_log, dt_bias, lower_bound)
    alpha = g.exp()
    beta = torch.sigmoid(b.float()).to(b.dtype).float()

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        prefix = g_cache[slot, :, :cursor].float().cumsum(1)  # [HV, c, K]
        total = prefix[:, -1] if cursor else torch.zeros(n_v_heads, k_dim, dtype=torch.float32)
        state = initial_state[slot].float() * total.exp()[:, None, :]
        if cursor:
            keys = k_cache[slot, :, :cursor].float().repeat_interleave(group, dim=0)
            decay = (total[:, None, :] - prefix).exp()
            deltas = d_cache[slot, :, :cursor].float()
            state = state + torch.einsum("hjv,hjk->hvk", deltas, decay * keys)
        k_row = k[row].repeat_interleave(group, dim=0)
        q_row = q[row].repeat_interleave(group, dim=0) * scale
        state_q = torch.einsum("hvk,hk->hv", state, alpha[row] * q_row)
        state_k = torch.einsum("hvk,hk->hv", state, alpha[row] * k_row)
        delta = beta[row][:, None] * (v[row] - state_k)
        out[row, 0].copy_(state_q + delta * (k_row * q_row).sum(-1, keepdim=True))
        if flush:
            new_state = state * alpha[row][:, None, :] + delta[:, :, None] * k_row[:, None, :]
            initial_state[slot].copy_(new_state)
        else:
            d_cache[slot, :, cursor].copy_(delta)
            g_cache[slot, :, cursor].copy_(g[row])
            k_cache[slot, :, cursor].copy_(k[row])
    return out, initial_state


def next_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Cursors after one decode step: back to 0 after a flush, one row further otherwise."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)
