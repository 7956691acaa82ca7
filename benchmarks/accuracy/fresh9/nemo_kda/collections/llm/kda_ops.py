"""ReplaySSM decode for KDA layers: the fused kernel's signature, with the CPU reference used where the
extension is not built."""

import torch

LAST_LAUNCH: dict[str, torch.Tensor] = {}  # what the last launch was given (tests, profiling)

@torch.no_grad()
def replayssm_decode(q, k, v, log_decay, beta, *, initial_state, d_cache, k_cache, g_cache,
                     ssm_state_indices, write_pos, scale=None, flush=False):
    """Appends each row's step to its slot's rings and replays them on the checkpoint state.

    q/log_decay [B, HV, K], k [B, H, K], v [B, HV, V], beta [B, HV]; d_cache [slots, HV, L, V],
    k_cache [slots, H, L, K], g_cache [slots, HV, L, K], initial_state [slots, HV, V, K].
    """
    ring_len, rep = g_cache.shape[2], g_cache.shape[1] // k_cache.shape[1]
    scale, out = q.shape[-1] ** -0.5 if scale is None else scale, torch.zeros(v.shape, dtype=torch.float32)
    for row, slot in enumerate(ssm_state_indices.tolist()):
        pos = int(write_pos[slot]) % ring_len
        g_cache[slot, :, pos], k_cache[slot, :, pos], d_cache[slot, :, pos] = log_decay[row], k[row], beta[row, :, None] * v[row]
        cum = g_cache[slot, :, : pos + 1].float().cumsum(dim=1)
        keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(rep, dim=0) * (cum[:, -1:] - cum).exp()
        state = initial_state[slot].float() * cum[:, -1:].exp()
        state = state + torch.einsum("htv,htk->hvk", d_cache[slot, :, : pos + 1].float(), keys)
        out[row] = torch.einsum("hvk,hk->hv", state, q[row].float()) * scale
        if flush:
            initial_state[slot] = state
    LAST_LAUNCH.clear()
    LAST_LAUNCH.update(d_ring=d_cache, k_ring=k_cache, gk_ring=g_cache, ssm_state=initial_state)
    return out.to(v.dtype)
