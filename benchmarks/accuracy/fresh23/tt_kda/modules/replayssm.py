# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Reference implementation of the fused recurrent KDA decode over replayed ring caches.

ReplaySSM keeps, per slot, a checkpoint of the recurrent state ``S [HV, V, K]`` and rings of the
last ``L`` deltas, keys and log-decays. A decode step rebuilds the current state from the
checkpoint and the ring, advances it by one token with the gated delta rule, appends the token's
entries to the ring and, when the ring is full, folds it back into the checkpoint.

The state recurrence is ``S_t = S_{t-1} * exp(g_t) + d_t k_t^T`` with the per-channel log-decay
``g_t = -exp(A_log) * softplus(a_t + dt_bias)`` and the delta ``d_t = beta_t (v_t - S k_t)``.
"""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F


class ReplayDecodeOutput(NamedTuple):
    """What a decode step returns: its output, and the cache tensors it updated in place."""

    out: torch.Tensor
    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


def kda_log_decay(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    num_v_heads: int,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Per-channel log-decays ``[..., HV, K]`` in float32 from the gate pre-activations ``a``."""
    a = a.float().unflatten(-1, (num_v_heads, -1))
    g = -torch.exp(A_log.float()).unsqueeze(-1) * F.softplus(
        a + dt_bias.float().view(num_v_heads, -1)
    )
    if lower_bound is not None:
        g = g.clamp_min(lower_bound)
    return g


def replay_state(
    state: torch.Tensor,
    d_ring: torch.Tensor,
    k_ring: torch.Tensor,
    g_ring: torch.Tensor,
    length: int,
    group: int = 1,
) -> torch.Tensor:
    """The state after the first ``length`` ring entries, in float32.

    Args:
        state (torch.Tensor): checkpoint ``[HV, V, K]``.
        d_ring (torch.Tensor): deltas ``[HV, L, V]``.
        k_ring (torch.Tensor): keys ``[H, L, K]``.
        g_ring (torch.Tensor): log-decays ``[HV, L, K]``.
        length (int): number of valid entries.
        group (int): value heads per key head.
    """
    s0 = state.float()
    if length == 0:
        return s0.clone()
    d = d_ring[:, :length].float()
    k = k_ring[:, :length].float().repeat_interleave(group, dim=0)
    csum = g_ring[:, :length].float().cumsum(dim=1)
    total = csum[:, -1]
    # decay accumulated between step t (exclusive) and the end of the ring
    tail = torch.exp(total.unsqueeze(1) - csum)
    return s0 * total.exp().unsqueeze(1) + torch.einsum("htv,htk->hvk", d, k * tail)


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
    out: Optional[torch.Tensor] = None,
    force_flush: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
) -> ReplayDecodeOutput:
    """One decode step for ``N`` tokens, each on its own cache slot.

    Args:
        mixed_qkv (torch.Tensor): ``[N, 2*H*K + HV*V]`` concatenated queries, keys and values.
        a (torch.Tensor): ``[N, HV*K]`` decay-gate pre-activations.
        b (torch.Tensor): ``[N, HV]`` write-strength logits.
        A_log (torch.Tensor): ``[HV]`` log decay rates.
        dt_bias (torch.Tensor): ``[HV*K]`` gate bias.
        scale (float): query scale.
        initial_state (torch.Tensor): checkpoints ``[slots, HV, V, K]``, updated at flushes.
        d_cache (torch.Tensor): delta rings ``[slots, HV, L, V]``.
        k_cache (torch.Tensor): key rings ``[slots, H, L, K]``.
        g_cache (torch.Tensor): log-decay rings ``[slots, HV, L, K]``; float32.
        ssm_state_indices (torch.Tensor): ``[N]`` slot of each token; negative for padding.
        write_pos (torch.Tensor): ``[slots]`` int32 ring positions.
        out (Optional[torch.Tensor]): ``[N, HV, V]`` output buffer.
        force_flush (Optional[torch.Tensor]): ``[N]`` bool, fold the ring after this token.
        lower_bound (Optional[float]): lower clamp of the log-decays.

    Returns:
        ReplayDecodeOutput: ``out`` and the cache tensors (updated in place).
    """
    num_tokens = mixed_qkv.shape[0]
    num_v_heads, ring_len, v_dim = d_cache.shape[1:]
    num_heads, k_dim = k_cache.shape[1], k_cache.shape[-1]
    group = num_v_heads // num_heads
    q, k, v = mixed_qkv.float().split(
        [num_heads * k_dim, num_heads * k_dim, num_v_heads * v_dim], dim=-1
    )
    q = F.normalize(q.view(num_tokens, num_heads, k_dim), dim=-1).repeat_interleave(group, dim=1)
    k = F.normalize(k.view(num_tokens, num_heads, k_dim), dim=-1)
    v = v.view(num_tokens, num_v_heads, v_dim)
    g = kda_log_decay(a, A_log, dt_bias, num_v_heads, lower_bound)
    beta = torch.sigmoid(b.float())
    if out is None:
        out = mixed_qkv.new_empty(num_tokens, num_v_heads, v_dim)

    for n in range(num_tokens):
        slot = int(ssm_state_indices[n])
        if slot < 0:
            out[n].zero_()
            continue
        pos = int(write_pos[slot])
        state = replay_state(
            initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group
        )
        state = state * g[n].exp().unsqueeze(1)
        keys = k[n].repeat_interleave(group, dim=0)
        delta = beta[n].unsqueeze(-1) * (v[n] - torch.einsum("hvk,hk->hv", state, keys))
        state = state + delta.unsqueeze(-1) * keys.unsqueeze(1)
        out[n] = (torch.einsum("hvk,hk->hv", state, q[n]) * scale).to(out.dtype)

        d_cache[slot, :, pos] = delta.to(d_cache.dtype)
        k_cache[slot, :, pos] = k[n].to(k_cache.dtype)
        g_cache[slot, :, pos] = g[n].to(g_cache.dtype)
        pos += 1
        if pos == ring_len or (force_flush is not None and bool(force_flush[n])):
            initial_state[slot] = state.to(initial_state.dtype)
            pos = 0
        write_pos[slot] = pos
    return ReplayDecodeOutput(out, initial_state, d_cache, k_cache, g_cache, write_pos)


def build_reference_decode() -> dict:
    """Runs the reference decode over a full ring (bf16 rings, fp32 log-decays)."""
    torch.manual_seed(0)
    slots, heads, v_heads, k_dim, v_dim, ring_len = 3, 2, 4, 8, 8, 4
    state = torch.zeros(slots, v_heads, v_dim, k_dim)
    d_cache = torch.zeros(slots, v_heads, ring_len, v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, heads, ring_len, k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, v_heads, ring_len, k_dim, dtype=torch.float32)
    write_pos = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.empty(v_heads).uniform_(1, 16).log()
    dt_bias = torch.randn(v_heads * k_dim) * 0.1
    indices = torch.tensor([2, 0], dtype=torch.int32)
    outputs = []
    for step in range(ring_len + 2):
        mixed_qkv = torch.randn(2, 2 * heads * k_dim + v_heads * v_dim, dtype=torch.bfloat16)
        a = torch.randn(2, v_heads * k_dim, dtype=torch.bfloat16)
        b = torch.randn(2, v_heads, dtype=torch.bfloat16)
        result = fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, k_dim**-0.5,
            state, d_cache, k_cache, g_cache, indices, write_pos,
            force_flush=torch.tensor([step == 1, False]),
        )
        outputs.append(result.out)
    return {"outputs": torch.stack(outputs), "final": result}
