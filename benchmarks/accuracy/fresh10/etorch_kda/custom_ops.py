"""Python reference of ``llama::replayssm_decode``. The ATen kernel is built with the custom-ops
library; export only sees this signature. Each call keeps the cache tensors it was given."""

from typing import Dict

import torch

REPLAY_OP_NAME = "llama::replayssm_decode"
_LAST_CALL: Dict[str, torch.Tensor] = {}


def last_call() -> Dict[str, torch.Tensor]:
    """The cache tensors of the most recent call (runner debugging)."""
    return dict(_LAST_CALL)


@torch.no_grad()
def fused_recurrent_kda_replayssm_decode(q, k, v, g, beta, *, scale, initial_state, d_cache, k_cache, g_cache,
                                         ssm_state_indices, write_pos, flush=False):
    """One step per row: appends (beta*v, k, g) at ``write_pos % L`` of the row's slot, replays the
    slot's rings on its checkpoint state and reads the result with ``q``. Returns [N, HV, V] fp32."""
    H, HV, L = k_cache.shape[1], g_cache.shape[1], g_cache.shape[2]
    rep = HV // H
    out = torch.zeros(q.shape[0], HV, d_cache.shape[-1], dtype=torch.float32)
    for row, slot in enumerate(ssm_state_indices.tolist()):
        pos = int(write_pos[row]) % L
        d_cache[slot, :, pos] = beta[row, :, None] * v[row].float()
        k_cache[slot, :, pos] = k[row]
        g_cache[slot, :, pos] = g[row]
        cum = g_cache[slot, :, : pos + 1].float().cumsum(1)
        keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(rep, 0) * (cum[:, -1:] - cum).exp()
        state = initial_state[slot].float() * cum[:, -1:].exp()
        state = state + torch.einsum("htv,htk->hvk", d_cache[slot, :, : pos + 1].float(), keys)
        out[row] = torch.einsum("hvk,hk->hv", state, q[row].float()) * scale
        if flush or pos == L - 1:
            initial_state[slot] = state
    _LAST_CALL.update(d_cache=d_cache, k_cache=k_cache, log_gate_cache=g_cache, ssm_state=initial_state)
    return out
