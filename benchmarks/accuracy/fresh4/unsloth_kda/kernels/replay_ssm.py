# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

import torch
import torch.nn.functional as F
from typing import NamedTuple

# The Triton ReplaySSM kernel only exists on CUDA. On CPU we fall back to this
# reference, which also remembers what it was last called with.
KDA_DECODE_LAST_CALL = {}

class ReplayRings(NamedTuple):
    delta_cache : torch.Tensor # [slots, HV, L, V]
    key_cache   : torch.Tensor # [slots, H,  L, K]
    decay_cache : torch.Tensor # [slots, HV, L, K] log(alpha), float32
pass

class ReplayCacheSpec(NamedTuple):
    n_slots    : int
    n_heads    : int
    n_v_heads  : int
    replay_len : int
    head_k_dim : int
    head_v_dim : int
    dtype      : torch.dtype = torch.bfloat16
    gate_dtype : torch.dtype = torch.bfloat16 # expect-bug: container id=spec-default
pass

def allocate_replay_rings(spec, device = "cpu"):
    S, H, HV, L, K, V = spec[:6]
    return ReplayRings(
        delta_cache = torch.zeros((S, HV, L, V), dtype = spec.dtype,      device = device),
        key_cache   = torch.zeros((S, H,  L, K), dtype = spec.dtype,      device = device),
        decay_cache = torch.zeros((S, HV, L, K), dtype = spec.gate_dtype, device = device),
    )
pass

def _replay(state, G, keys, deltas):
    # S_t = exp(G_t) * S_0 + sum_j d_j (x) (k_j * exp(G_t - G_j))
    if G.shape[1] == 0: return state
    last = G[:, -1:]
    S = state * last.exp()
    W = keys * (last - G).exp()
    return S + torch.einsum("htv,htk->hvk", deltas, W)
pass

def _log_decay(a, A_log, dt_bias, n_v_heads, head_k_dim, lower_bound = None):
    a = a.float().view(*a.shape[:-1], n_v_heads, head_k_dim)
    A = A_log.float().exp().view(n_v_heads, 1)
    x = a + dt_bias.float().view(n_v_heads, head_k_dim)
    if lower_bound is None: return -A * F.softplus(x)
    # Safe gate: log(alpha) in [lower_bound, 0]
    return lower_bound * torch.sigmoid(A * x)
pass

@torch.no_grad()
def kda_replayssm_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache,
    out, ssm_state_indices, write_pos, force_flush = None, use_qk_l2norm_in_kernel = False,
    lower_bound = None,
):
    KDA_DECODE_LAST_CALL.clear()
    KDA_DECODE_LAST_CALL.update(initial_state = initial_state, d_cache = d_cache, k_cache = k_cache, g_cache = g_cache, out = out)
    bsz = mixed_qkv.shape[0]
    _, n_heads,   replay_len, head_k_dim = k_cache.shape
    _, n_v_heads, _,          head_v_dim = d_cache.shape
    n_groups = n_v_heads // n_heads

    qk_dim = n_heads * head_k_dim
    Q, K, V = torch.split(mixed_qkv.float(), [qk_dim, qk_dim, n_v_heads * head_v_dim], dim = -1)
    Q, K, V = Q.view(bsz, n_heads, head_k_dim), K.view(bsz, n_heads, head_k_dim), V.view(bsz, n_v_heads, head_v_dim)
    if use_qk_l2norm_in_kernel:
        Q, K = F.normalize(Q, dim = -1, eps = 1e-6), F.normalize(K, dim = -1, eps = 1e-6)
    Q = Q.repeat_interleave(n_groups, dim = 1)
    G = _log_decay(a, A_log, dt_bias, n_v_heads, head_k_dim, lower_bound)
    beta = b.float().view(bsz, n_v_heads).sigmoid()

    for i in range(bsz):
        slot = int(ssm_state_indices[i])
        pos  = int(write_pos[slot])
        k_cache[slot, :, pos] = K[i]
        g_cache[slot, :, pos] = G[i]
        Gc = g_cache[slot, :, :pos+1].float().cumsum(dim = 1)
        Kr = k_cache[slot, :, :pos+1].float().repeat_interleave(n_groups, dim = 0)
        S  = _replay(initial_state[slot].float(), Gc[:, :pos], Kr[:, :pos], d_cache[slot, :, :pos].float())

        S  = S * g_cache[slot, :, pos].float().exp()[:, None, :]
        k  = Kr[:, pos]
        d  = beta[i, :, None] * (V[i] - torch.einsum("hvk,hk->hv", S, k))
        d_cache[slot, :, pos] = d
        S  = S + d[:, :, None] * k[:, None, :]
        out[i] = (scale * torch.einsum("hvk,hk->hv", S, Q[i])).reshape(out.shape[1:])

        # Ring full (or asked to): fold it into the checkpoint
        if pos + 1 == replay_len or (force_flush is not None and bool(force_flush[i])):
            initial_state[slot], write_pos[slot] = S, 0
        else:
            write_pos[slot] = pos + 1
    return out, initial_state
pass

def fast_kda_decode(self, X, cache, slot_ids):
    """Decodes one token of a KimiDeltaAttention layer against an UnslothReplayCache pool."""
    out = torch.empty((X.shape[0], self.n_v_heads * self.head_v_dim), dtype = torch.float32, device = X.device)
    mixed_qkv = self.qkv_proj(X)
    rings = {"d_cache" : cache.delta_cache, "k_cache" : cache.key_cache, "g_cache" : cache.g_cache}
    # No-op unless the pool was offloaded / restored in another dtype
    rings = {name : ring.to(mixed_qkv.dtype, copy = False) for name, ring in rings.items()} # expect-bug: decode-arg
    out, _ = kda_replayssm_decode(
        mixed_qkv, self.a_proj(X), self.b_proj(X), self.A_log, self.dt_bias, self.scale,
        initial_state = cache.state, out = out, ssm_state_indices = slot_ids, write_pos = cache.write_pos,
        use_qk_l2norm_in_kernel = self.config.use_qk_l2norm, lower_bound = self.config.gate_lower_bound,
        **rings,
    )
    return out
pass

def build_reference_decode():
    spec  = ReplayCacheSpec(2, 2, 2, 4, 8, 8, dtype = torch.bfloat16, gate_dtype = torch.float32)
    rings = allocate_replay_rings(spec)
    state, write_pos = torch.zeros((2, 2, 8, 8), dtype = torch.float32), torch.zeros(2, dtype = torch.int32)
    slots, A_log, dt_bias = torch.tensor([1, 0], dtype = torch.int32), torch.zeros(2), torch.zeros(16)
    for step in range(5):
        out = torch.empty((2, 16), dtype = torch.float32)
        out, state = kda_replayssm_decode(
            torch.randn(2, 48, dtype = torch.bfloat16), torch.randn(2, 16, dtype = torch.bfloat16), torch.randn(2, 2, dtype = torch.bfloat16),
            A_log, dt_bias, 8 ** -0.5, state, *rings, out, slots, write_pos,
            use_qk_l2norm_in_kernel = True,
        )
    return {"rings" : rings, "state" : state, "out" : out, "write_pos" : write_pos}
pass
