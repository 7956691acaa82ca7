# Copyright (c) OpenMMLab. All rights reserved.
"""Torch implementation of the ReplaySSM decode step of Kimi Delta Attention.

Arguments follow the sglang kernel (``fused_recurrent_kda_replayssm_decode``) so the fused
kernel can be dropped in. Math runs in float32; results are written back with ``copy_``.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F


def _check_shape(name: str, tensor: torch.Tensor, shape: Tuple[int, ...]):
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f'{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}.')


def kda_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: Optional[float] = None):
    """Per-channel log-decay ``g`` in float32.

    Args:
        a (Tensor): gate activations ``[..., num_v_heads, head_k_dim]``.
        A_log (Tensor): ``[num_v_heads]``.
        dt_bias (Tensor): ``[num_v_heads, head_k_dim]``.
        lower_bound (float): bounded gate ``lb * sigmoid(A * x)`` when given.
    """
    x = a.float() + dt_bias.float()
    A = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -A * F.softplus(x)
    return lower_bound * torch.sigmoid(A * x)


def replay_decode_step(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                       dt_bias: torch.Tensor, scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor,
                       k_cache: torch.Tensor, g_cache: torch.Tensor, out: torch.Tensor,
                       ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
                       force_flush: Optional[torch.Tensor] = None, use_qk_l2norm_in_kernel: bool = True,
                       lower_bound: Optional[float] = None):
    """One ReplaySSM decode step (one token per row).

    The state of every row is rebuilt from its checkpoint ``initial_state[slot]`` and the ring rows
    before ``write_pos``; a row that is not flushed appends one row to the rings, a flushed row
    writes the new state into its checkpoint. Rows with a negative slot are padding.

    Returns:
        Tuple[Tensor, Tensor]: ``out`` and ``initial_state``.
    """
    batch = mixed_qkv.size(0)
    num_slots, num_v_heads, head_v_dim, head_k_dim = initial_state.shape
    num_heads = k_cache.size(1)
    ring_len = d_cache.size(2)
    if num_v_heads % num_heads != 0:
        raise ValueError(f'k_cache: {num_heads} key heads do not divide {num_v_heads} value heads.')
    _check_shape('mixed_qkv', mixed_qkv, (batch, 2 * num_heads * head_k_dim + num_v_heads * head_v_dim))
    _check_shape('d_cache', d_cache, (num_slots, num_v_heads, ring_len, head_v_dim))
    _check_shape('k_cache', k_cache, (num_slots, num_heads, ring_len, head_k_dim))
    _check_shape('g_cache', g_cache, (num_slots, num_v_heads, ring_len, head_k_dim))
    _check_shape('out', out, (batch, 1, num_v_heads, head_v_dim))

    qk_size = num_heads * head_k_dim
    qkv = mixed_qkv.float()
    q = qkv[:, :qk_size].unflatten(-1, (num_heads, head_k_dim))
    k = qkv[:, qk_size:2 * qk_size].unflatten(-1, (num_heads, head_k_dim))
    v = qkv[:, 2 * qk_size:].unflatten(-1, (num_v_heads, head_v_dim))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    g = kda_gate(a.reshape(batch, num_v_heads, head_k_dim), A_log, dt_bias.reshape(num_v_heads, head_k_dim),
                 lower_bound)
    beta = torch.sigmoid(b).float()
    heads = torch.arange(num_v_heads, device=k.device) // (num_v_heads // num_heads)

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        state = initial_state[slot].float()
        if cursor > 0:
            prefix = g_cache[slot, :, :cursor].float().cumsum(1)
            total = prefix[:, -1]
            keys = k_cache[slot, :, :cursor].float()[heads]
            weights = torch.exp(total[:, None] - prefix) * keys
            deltas = d_cache[slot, :, :cursor].float()
            state = state * torch.exp(total)[:, None, :] + torch.einsum('hjv,hjk->hvk', deltas, weights)
        k_row = k[row][heads]
        q_row = scale * q[row][heads]
        decayed = state * g[row].exp()[:, None, :]
        delta = beta[row][:, None] * (v[row] - torch.einsum('hvk,hk->hv', decayed, k_row))
        output = torch.einsum('hvk,hk->hv', decayed, q_row) + delta * (k_row * q_row).sum(-1, keepdim=True)
        out[row, 0].copy_(output)
        if flush:
            initial_state[slot].copy_(decayed + delta[:, :, None] * k_row[:, None, :])
        else:
            d_cache[slot, :, cursor].copy_(delta)
            g_cache[slot, :, cursor].copy_(g[row])
            k_cache[slot, :, cursor].copy_(k[row])
    return out, initial_state


def next_write_pos(write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None):
    """Cursors after one decode step: 0 after a flush, else one further."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)


def make_dummy_decode_inputs(batch: int, num_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                             dtype: torch.dtype = torch.bfloat16, device: str = 'cpu',
                             generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """Random activations and gate parameters of the shapes a decode step takes (warmup, profiling)."""
    width = 2 * num_heads * head_k_dim + num_v_heads * head_v_dim

    def _randn(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    return dict(
        mixed_qkv=_randn(batch, width),
        a=_randn(batch, num_v_heads * head_k_dim),
        b=_randn(batch, num_v_heads),
        A_log=torch.log(torch.linspace(1.0, 8.0, num_v_heads, device=device)),
        dt_bias=0.1 * torch.randn(num_v_heads * head_k_dim, generator=generator).to(device),
    )


def build_reference_decode():
    """Six decode steps of two sequences (and a padding row) with bf16 state and rings."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    num_slots, num_heads, num_v_heads, head_dim, ring_len = 3, 2, 4, 8, 4
    state = torch.zeros(num_slots, num_v_heads, head_dim, head_dim, dtype=torch.bfloat16)
    d_cache = torch.zeros(num_slots, num_v_heads, ring_len, head_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(num_slots, num_heads, ring_len, head_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(num_slots, num_v_heads, ring_len, head_dim, dtype=torch.float32)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32)
    write_pos = torch.zeros(3, dtype=torch.int32)
    outs = []
    for step in range(6):
        inputs = make_dummy_decode_inputs(3, num_heads, num_v_heads, head_dim, head_dim, generator=generator)
        force_flush = torch.tensor([0, 0, int(step == 1)], dtype=torch.int32)
        out = torch.empty(3, 1, num_v_heads, head_dim, dtype=torch.bfloat16)
        replay_decode_step(**inputs, scale=head_dim**-0.5, initial_state=state, d_cache=d_cache, k_cache=k_cache,
                           g_cache=g_cache, out=out, ssm_state_indices=slots, write_pos=write_pos,
                           force_flush=force_flush)
        write_pos = next_write_pos(write_pos, ring_len, force_flush)
        outs.append(out)
    return dict(out=torch.stack(outs), state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                write_pos=write_pos)
