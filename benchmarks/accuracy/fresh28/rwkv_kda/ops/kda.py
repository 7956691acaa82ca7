"""CPU stand-in for the ReplaySSM KDA decode kernel, with sglang's ``fused_recurrent_kda`` keywords.

A slot's checkpoint ``initial_state[slot]`` is written only when its ring is full (a fold);
otherwise row ``write_pos[slot]`` of ``d_cache``/``k_cache``/``g_cache`` (float32) is, and the
cursor moves on. Every call is kept, by reference, in ``CALLS``.
"""

import torch
import torch.nn.functional as F

CALLS = []

def last_call():
    return CALLS[-1] if CALLS else None

def l2norm(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)

def kda_gate(a, A_log, dt_bias, lower_bound=None):
    """Log-decays ``[..., HV, K]``, float32, from the gate inputs ``a [..., HV, K]``."""
    x, rate = a.float() + dt_bias.float(), A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)

def replay(checkpoint, d_rows, k_rows, g_rows, count, group):
    """The state ``[HV, V, K]`` after the first ``count`` ring rows on top of ``checkpoint``."""
    state = checkpoint.float()
    if count == 0:
        return state
    prefix = g_rows[:, :count].float().cumsum(1)
    keys = k_rows[:, :count].float().repeat_interleave(group, 0) * torch.exp(prefix[:, -1:] - prefix)
    return state * prefix[:, -1].exp().unsqueeze(1) + torch.einsum("hjv,hjk->hvk", d_rows[:, :count].float(), keys)

def kda_readout(state, q, k, v, g, beta, scale):
    """One token on a replayed state: ``(output [HV, V], delta row [HV, V], decayed state)``."""
    state = state * g.float().exp().unsqueeze(1)
    delta = beta.float().unsqueeze(-1) * (v.float() - torch.einsum("hvk,hk->hv", state, k))
    out = torch.einsum("hvk,hk->hv", state, q * scale) + delta * (k * q * scale).sum(-1, keepdim=True)
    return out, delta, state

def fused_recurrent_kda_replayssm_decode(
    q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None,
    d_cache=None, k_cache=None, g_cache=None, write_pos=None, use_qk_l2norm_in_kernel=True, out=None,
):
    """``q, k [B, H, K]``, ``v [B, HV, V]``, ``g [B, HV, K]``, ``beta [B, HV]``; caches ``[slots, HV, V, K]``,
    ``[slots, HV, L, V]``, ``[slots, H, L, K]``, ``[slots, HV, L, K]``; negative indices are padding."""
    CALLS.append(dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, initial_state_indices=initial_state_indices,
                      d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, write_pos=write_pos))
    del CALLS[:-8]
    rows, heads, k_dim = q.shape
    group, ring_len = d_cache.shape[1] // heads, d_cache.shape[2]
    scale = k_dim ** -0.5 if scale is None else scale
    qf, kf = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        qf, kf = l2norm(qf), l2norm(kf)
    if out is None:
        out = v.new_zeros(v.shape)
    for b in range(rows):
        slot = int(initial_state_indices[b])
        if slot < 0:
            out[b].zero_()
            continue
        pos = int(write_pos[slot])
        state = replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key, query = kf[b].repeat_interleave(group, 0), qf[b].repeat_interleave(group, 0)
        out[b], delta, state = kda_readout(state, query, key, v[b], g[b], beta[b], scale)
        if pos == ring_len - 1:
            initial_state[slot] = state + delta.unsqueeze(-1) * key.unsqueeze(1)
            write_pos[slot] = 0
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = kf[b]
            g_cache[slot, :, pos] = g[b]
            write_pos[slot] = pos + 1
    return out, initial_state

def build_reference_step():
    """Six steps on three slots: bf16 delta/key rings, a dtype-less (float32) log-decay ring."""
    slots, hv, h, k_dim, v_dim, ring = 3, 2, 1, 4, 4, 3
    initial_state = torch.zeros(slots, hv, v_dim, k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring, v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring, k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring, k_dim)
    write_pos, rows, outs = torch.zeros(slots, dtype=torch.int32), torch.tensor([2, -1, 0], dtype=torch.int32), []
    for _ in range(6):
        q, k, v = torch.randn(3, h, k_dim), torch.randn(3, h, k_dim), torch.randn(3, hv, v_dim).bfloat16()
        g = kda_gate(torch.randn(3, hv, k_dim).bfloat16(), torch.zeros(hv), torch.zeros(hv, k_dim))
        outs.append(fused_recurrent_kda_replayssm_decode(
            q=q, k=k, v=v, g=g, beta=torch.rand(3, hv), initial_state=initial_state, initial_state_indices=rows,
            d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, write_pos=write_pos)[0].clone())
    return {"initial_state": initial_state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache, "out": torch.stack(outs)}
