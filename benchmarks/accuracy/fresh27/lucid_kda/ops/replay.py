""" cpu stand-in for the fused ReplaySSM decode kernel (sglang keyword names), records what it was given """

import torch

from ..utils import default, l2norm

DECODE_CALLS = []

def replay(state, delta_rows, key_rows, log_decay_rows, count):
    """ fold the first `count` ring rows onto the checkpoint, in float32 """
    state = state.float()
    for j in range(count):
        state = state * log_decay_rows[:, j].float().exp()[:, None, :]
        state = state + delta_rows[:, j].float()[..., None] * key_rows[:, j].float()[:, None, :]
    return state

def fused_recurrent_kda_replayssm_decode(
    q, k, v, g, beta, scale = None, initial_state = None, d_cache = None, k_cache = None, g_cache = None,
    ssm_state_indices = None, write_pos = None, use_qk_l2norm_in_kernel = True, **kwargs
):
    """
    q, k: (b, 1, h, dk)  v: (b, 1, hv, dv)  g: (b, 1, hv, dk) log decays  beta: (b, 1, hv)
    initial_state: (slots, hv, dv, dk)  d_cache: (slots, hv, L, dv)  k_cache: (slots, h, L, dk)
    g_cache: (slots, hv, L, dk) float32  ssm_state_indices, write_pos: (b,) int32
    a row at the last ring position folds into its checkpoint instead of writing a ring row
    """
    DECODE_CALLS[:] = DECODE_CALLS[-15:] + [dict(initial_state = initial_state, d_cache = d_cache, k_cache = k_cache,
                                                 g_cache = g_cache, indices = ssm_state_indices, write_pos = write_pos)]

    out_dtype, (batch, _, heads, dim_k), (heads_v, ring_len, dim_v) = v.dtype, q.shape, d_cache.shape[1:]
    groups, scale = heads_v // heads, default(scale, dim_k ** -0.5)
    q, k, v, g, beta = (t[:, 0].float() for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    out = torch.zeros(batch, 1, heads_v, dim_v, dtype = torch.float32)

    for row in range(batch):
        slot, pos = int(ssm_state_indices[row]), int(write_pos[row])
        if slot < 0:
            continue
        key_rows = k_cache[slot].repeat_interleave(groups, dim = 0)
        state = replay(initial_state[slot], d_cache[slot], key_rows, g_cache[slot], pos)
        qr, kr = (t[row].repeat_interleave(groups, dim = 0) for t in (q, k))
        state = state * g[row].exp()[:, None, :]
        delta = beta[row][:, None] * (v[row] - torch.einsum('hvk,hk->hv', state, kr))
        state = state + delta[..., None] * kr[:, None, :]
        out[row, 0] = torch.einsum('hvk,hk->hv', state, qr) * scale
        if pos == ring_len - 1:
            initial_state[slot] = state
        else:
            d_cache[slot, :, pos], k_cache[slot, :, pos], g_cache[slot, :, pos] = delta, k[row], g[row]

    return out.to(out_dtype)

def build_reference_decode():
    slots, heads, heads_v, dim_k, dim_v, ring_len = 2, 1, 2, 4, 4, 3
    initial_state = torch.zeros(slots, heads_v, dim_v, dim_k)
    d_cache = torch.zeros(slots, heads_v, ring_len, dim_v, dtype = torch.bfloat16)
    k_cache = torch.zeros(slots, heads, ring_len, dim_k, dtype = torch.bfloat16)
    g_cache = torch.zeros(slots, heads_v, ring_len, dim_k)
    write_pos, indices = torch.zeros(slots, dtype = torch.int32), torch.tensor([1, 0], dtype = torch.int32)
    outs = []
    for _ in range(4):
        q, k = torch.randn(2, slots, 1, heads, dim_k, dtype = torch.bfloat16).unbind(0)
        v, g = torch.randn(slots, 1, heads_v, dim_v, dtype = torch.bfloat16), -torch.rand(slots, 1, heads_v, dim_k)
        beta = torch.rand(slots, 1, heads_v, dtype = torch.bfloat16)
        outs.append(fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta, initial_state = initial_state, d_cache = d_cache, k_cache = k_cache, g_cache = g_cache,
            ssm_state_indices = indices, write_pos = write_pos
        ))
        write_pos = (write_pos + 1) % ring_len
    return dict(initial_state = initial_state, d_cache = d_cache, k_cache = k_cache, g_cache = g_cache,
                write_pos = write_pos, out = torch.cat(outs))
