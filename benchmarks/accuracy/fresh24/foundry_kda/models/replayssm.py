# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Reference (pure PyTorch) ReplaySSM decode for Kimi Delta Attention.

ReplaySSM keeps, per layer and per decode slot, a float32 checkpoint ``S[HV, V, K]`` and three
ring buffers holding the last ``L`` steps:

* ``d_cache [slots, HV, L, V]``: the deltas ``beta * (v - S k)``,
* ``k_cache [slots, H, L, K]``: the L2-normalised keys,
* ``g_cache [slots, HV, L, K]``: the per-channel log-decays ``g``,

plus an int32 write position per slot. The state at any step is rebuilt from the checkpoint and
the ring (prefix sums of ``g``, exponentiated), and the ring is folded into the checkpoint when
it is full. Deltas and keys may be stored in the model dtype. The log-decays are summed over the
whole ring and the rebuilt state is written into the checkpoint at every flush, so the gate ring
is float32.

The fused Triton kernel has the same signature; this module is the CPU fallback and the
numerical reference for it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "ReplayDecodeOutput",
    "fused_recurrent_kda_replayssm_decode",
    "kda_log_decay",
    "naive_recurrent_kda",
    "replay_state",
    "split_mixed_qkv",
]


class ReplayDecodeOutput(NamedTuple):
    """What :func:`fused_recurrent_kda_replayssm_decode` returns.

    The rings are the tensors that were written to: the ones passed in, or contiguous copies of
    them where they were not contiguous. Callers keep the returned rings.
    """

    out: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


def split_mixed_qkv(
    mixed_qkv: torch.Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Splits ``[..., 2*H*K + HV*V]`` into ``q, k [..., H, K]`` and ``v [..., HV, V]``."""
    qk_dim = num_k_heads * head_k_dim
    q, k, v = mixed_qkv.split([qk_dim, qk_dim, num_v_heads * head_v_dim], dim=-1)
    return (
        q.unflatten(-1, (num_k_heads, head_k_dim)),
        k.unflatten(-1, (num_k_heads, head_k_dim)),
        v.unflatten(-1, (num_v_heads, head_v_dim)),
    )


def kda_log_decay(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """Per-channel log-decays ``g = -exp(A_log) * softplus(a + dt_bias)``, in float32.

    Args:
        a: Gate projection, ``[..., HV * K]``.
        A_log: ``[HV]``.
        dt_bias: ``[HV * K]``.
        lower_bound: Optional floor on ``g`` (bounded-decay variants).

    Returns:
        ``[..., HV, K]`` float32.
    """
    num_v_heads = A_log.shape[0]
    a = a.float().unflatten(-1, (num_v_heads, -1))
    bias = dt_bias.float().view(num_v_heads, -1)
    g = -A_log.float().exp().unsqueeze(-1) * F.softplus(a + bias)
    if lower_bound is not None:
        g = g.clamp(min=lower_bound)
    return g


def replay_state(
    checkpoint: torch.Tensor,
    d_ring: torch.Tensor,
    k_ring: torch.Tensor,
    g_ring: torch.Tensor,
    num_valid: int,
) -> torch.Tensor:
    """Rebuilds the state ``[HV, V, K]`` of one slot from its checkpoint and ring.

    ``k_ring`` is given per value head (``[HV, L, K]``). The checkpoint is decayed by the whole
    ring; each entry ``d_i k_i^T`` by the steps that followed it.
    """
    state = checkpoint.float()
    if num_valid == 0:
        return state.clone()
    cumulative = g_ring[:, :num_valid].float().cumsum(dim=1)
    total = cumulative[:, -1]
    state = state * total.exp().unsqueeze(1)
    decayed_keys = k_ring[:, :num_valid].float() * (total.unsqueeze(1) - cumulative).exp()
    return state + torch.einsum("hnv,hnk->hvk", d_ring[:, :num_valid].float(), decayed_keys)


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


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
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    out: torch.Tensor | None = None,
    force_flush: torch.Tensor | None = None,
    lower_bound: float | None = None,
) -> ReplayDecodeOutput:
    """One decode step of KDA for a batch of sequences, each in its own cache slot.

    Args:
        mixed_qkv: ``[N, 2*H*K + HV*V]`` fused q/k/v projection of the new tokens.
        a: ``[N, HV*K]`` gate projection.
        b: ``[N, HV]`` beta logits.
        A_log, dt_bias: The layer's decay parameters.
        scale: Query scale.
        initial_state: ``[slots, HV, V, K]`` float32 checkpoints (updated at a flush).
        d_cache, k_cache, g_cache: The rings (see the module docstring), updated in place.
        ssm_state_indices: ``[N]`` slot of each sequence; negative entries are padding.
        write_pos: ``[slots]`` int32 ring positions, updated in place.
        out: Optional ``[N, HV, V]`` output buffer.
        force_flush: Optional ``[N]`` bools; folds the ring into the checkpoint after the step.
        lower_bound: Optional floor on the log-decays.
    """
    num_slots, num_v_heads, ring_len, head_v_dim = d_cache.shape
    num_k_heads, head_k_dim = k_cache.shape[1], k_cache.shape[3]
    expected = (num_slots, num_v_heads, ring_len, head_k_dim)
    if tuple(g_cache.shape) != expected:
        raise ValueError(f"g_cache has shape {tuple(g_cache.shape)}, expected {expected}")
    group = num_v_heads // num_k_heads
    d_cache, k_cache, g_cache = _contiguous(d_cache), _contiguous(k_cache), _contiguous(g_cache)
    batch = mixed_qkv.shape[0]
    if out is None:
        out = mixed_qkv.new_empty(batch, num_v_heads, head_v_dim)
    with torch.autocast(device_type=mixed_qkv.device.type, enabled=False):
        q, k, v = split_mixed_qkv(mixed_qkv.float(), num_k_heads, num_v_heads, head_k_dim, head_v_dim)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        g = kda_log_decay(a, A_log, dt_bias, lower_bound)
        beta = b.float().sigmoid()
        for i in range(batch):
            slot = int(ssm_state_indices[i])
            if slot < 0:
                out[i] = 0
                continue
            pos = int(write_pos[slot])
            keys = k_cache[slot].repeat_interleave(group, dim=0)
            state = replay_state(initial_state[slot], d_cache[slot], keys, g_cache[slot], pos)
            key = k[i].repeat_interleave(group, dim=0)
            query = q[i].repeat_interleave(group, dim=0)
            state = state * g[i].exp().unsqueeze(1)
            delta = beta[i].unsqueeze(-1) * (v[i] - torch.einsum("hvk,hk->hv", state, key))
            state = state + delta.unsqueeze(-1) * key.unsqueeze(1)
            out[i] = scale * torch.einsum("hvk,hk->hv", state, query)
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = k[i]
            g_cache[slot, :, pos] = g[i]
            pos += 1
            if pos == ring_len or (force_flush is not None and bool(force_flush[i])):
                # Fold what the ring stores (not the float32 state above) into the checkpoint, so
                # that the checkpoint always equals a replay of the cache.
                keys = k_cache[slot].repeat_interleave(group, dim=0)
                initial_state[slot] = replay_state(
                    initial_state[slot], d_cache[slot], keys, g_cache[slot], pos
                )
                pos = 0
            write_pos[slot] = pos
    return ReplayDecodeOutput(out, d_cache, k_cache, g_cache, write_pos)


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step KDA over full sequences (training and prefill reference).

    ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g [B, T, HV, K]``, ``beta [B, T, HV]``;
    returns ``o [B, T, HV, V]`` and the final state ``[B, HV, V, K]``, both float32.
    """
    batch, steps, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    group = num_v_heads // num_k_heads
    q = F.normalize(q.float(), dim=-1).repeat_interleave(group, dim=2)
    k = F.normalize(k.float(), dim=-1).repeat_interleave(group, dim=2)
    if initial_state is None:
        state = q.new_zeros(batch, num_v_heads, head_v_dim, head_k_dim)
    else:
        state = initial_state.float().clone()
    outputs = []
    for t in range(steps):
        state = state * g[:, t].float().exp().unsqueeze(2)
        predicted = torch.einsum("bhvk,bhk->bhv", state, k[:, t])
        delta = beta[:, t].float().unsqueeze(-1) * (v[:, t].float() - predicted)
        state = state + delta.unsqueeze(-1) * k[:, t].unsqueeze(2)
        outputs.append(scale * torch.einsum("bhvk,bhk->bhv", state, q[:, t]))
    return torch.stack(outputs, dim=1), state


def build_reference_decode() -> dict[str, torch.Tensor]:
    """Six decode steps of two sequences on a three-slot cache with a ring of four."""
    torch.manual_seed(0)
    slots, num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len = 3, 2, 4, 8, 8, 4
    dtype = torch.bfloat16
    state = torch.zeros(slots, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, num_v_heads, ring_len, head_v_dim, dtype=dtype)
    k_cache = torch.zeros(slots, num_k_heads, ring_len, head_k_dim, dtype=dtype)
    g_cache = torch.zeros(slots, num_v_heads, ring_len, head_k_dim, dtype=torch.float32)
    write_pos = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.randn(num_v_heads) * 0.1
    dt_bias = torch.randn(num_v_heads * head_k_dim) * 0.1
    indices = torch.tensor([0, 2])
    width = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    result = None
    for step in range(6):
        result = fused_recurrent_kda_replayssm_decode(
            torch.randn(2, width, dtype=dtype),
            torch.randn(2, num_v_heads * head_k_dim, dtype=dtype),
            torch.randn(2, num_v_heads, dtype=dtype),
            A_log,
            dt_bias,
            head_k_dim**-0.5,
            state,
            d_cache,
            k_cache,
            g_cache,
            indices,
            write_pos,
            force_flush=torch.tensor([False, step == 2]),
        )
    assert result is not None
    return {
        "state": state,
        "d_cache": result.d_cache,
        "k_cache": result.k_cache,
        "g_cache": result.g_cache,
        "write_pos": result.write_pos,
        "out": result.out,
    }
