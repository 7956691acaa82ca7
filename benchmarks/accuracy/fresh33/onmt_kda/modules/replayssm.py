"""ReplaySSM decode step of Kimi Delta Attention (CPU path of the fused op).

Each cache slot holds a checkpoint ``state [slots, HV, V, K]`` and rings of ``L`` rows: deltas
``d_cache [slots, HV, L, V]``, keys ``k_cache [slots, H, L, K]`` and per-step log-decays
``g_cache [slots, HV, L, K]``. A step appends one row at the slot's cursor (``write_pos``, int32,
advanced in place); a full ring is folded into the checkpoint. Replay prefix-sums and
exponentiates the log-decays, so ``g_cache`` is float32 whatever the model dtype is.
"""

import torch
import torch.nn.functional as F

_calls = []


def last_call():
    """Ring arguments of the latest decode step (by reference)."""
    return _calls[-1] if _calls else None


def _replay(state, deltas, keys, log_decays, rows, group):
    if rows == 0:
        return state.float().clone()
    prefix = log_decays[:, :rows].float().cumsum(1)
    total = prefix[:, -1]
    keys = keys[:, :rows].float().repeat_interleave(group, dim=0) * torch.exp(total.unsqueeze(1) - prefix)
    return state.float() * total.exp().unsqueeze(1) + torch.einsum("hjv,hjk->hvk", deltas[:, :rows].float(), keys)


def replayssm_kda_decode(q, k, v, a, b, *, state, d_cache, k_cache, g_cache, slot_idx, write_pos, A_log, dt_bias, scale=None):
    """One token for each of ``B`` rows; row ``i`` decodes on slot ``slot_idx[i]`` (negative: padding).

    ``q, k [B, H, K]``, ``v [B, HV, V]``, ``a [B, HV, K]``, ``b [B, HV]``. Returns ``[B, HV, V]``.
    """
    if any(t.dim() != 4 for t in (state, d_cache, k_cache, g_cache)):
        raise ValueError("state and rings must be 4-d")
    _calls.append(dict(state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, slot_idx=slot_idx, write_pos=write_pos))
    del _calls[:-4]
    group, ring_len = v.shape[1] // k.shape[1], d_cache.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = v.new_zeros(v.shape)
    q = F.normalize(q.float(), dim=-1).repeat_interleave(group, dim=1) * scale
    k_rows = F.normalize(k.float(), dim=-1)
    k = k_rows.repeat_interleave(group, dim=1)
    g = -A_log.float().exp().unsqueeze(-1) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    for i, slot in enumerate(slot_idx.tolist()):
        if slot < 0:
            continue
        pos = int(write_pos[slot])
        h = _replay(state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        alpha = g[i].exp()
        delta = beta[i].unsqueeze(-1) * (v[i].float() - torch.einsum("hvk,hk->hv", h, alpha * k[i]))
        out[i] = torch.einsum("hvk,hk->hv", h, alpha * q[i]) + delta * (k[i] * q[i]).sum(-1, keepdim=True)
        if pos == ring_len - 1:
            state[slot] = h * alpha.unsqueeze(1) + delta.unsqueeze(-1) * k[i].unsqueeze(1)
            write_pos[slot] = 0
        else:
            d_cache[slot, :, pos], k_cache[slot, :, pos], g_cache[slot, :, pos] = delta, k_rows[i], g[i]
            write_pos[slot] = pos + 1
    return out


def build_reference_decode():
    """Six steps on three slots (one padding row) with bf16 delta/key rings."""
    torch.manual_seed(0)
    state = torch.zeros(3, 4, 8, 8, dtype=torch.float32)
    d_cache = torch.zeros(3, 4, 4, 8, dtype=torch.bfloat16)
    k_cache = torch.zeros(3, 2, 4, 8, dtype=torch.bfloat16)
    g_cache = torch.zeros(3, 4, 4, 8)
    write_pos = torch.zeros(3, dtype=torch.int32)
    slot_idx = torch.tensor([2, -1, 0], dtype=torch.int32)
    outs = []
    for _ in range(6):
        q, k, v, a = (torch.randn(shape).bfloat16() for shape in ((3, 2, 8), (3, 2, 8), (3, 4, 8), (3, 4, 8)))
        outs.append(replayssm_kda_decode(q, k, v, a, torch.randn(3, 4).bfloat16(), state=state, d_cache=d_cache,
                                         k_cache=k_cache, g_cache=g_cache, slot_idx=slot_idx, write_pos=write_pos,
                                         A_log=torch.linspace(-1.0, 0.5, 4), dt_bias=torch.zeros(4, 8)))
    return {"state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache,
            "write_pos": write_pos, "out": torch.stack(outs)}
