"""ReplaySSM decode of Kimi Delta Attention: the CPU implementation of the fused op.

Per slot: a checkpoint ``state [S, HV, V, K]`` and rings of ``L`` rows of deltas
``d_cache [S, HV, L, V]``, normalised keys ``k_cache [S, H, L, K]`` and log-decays
``g_cache [S, HV, L, K]`` (float32: replaying sums and exponentiates them). A step replays
the ring, applies the delta rule and appends a row; the row at ``L - 1`` folds the ring into
the checkpoint instead. ``write_pos [S]`` (int32) is advanced in place. The last calls are
kept by reference for the profiler hooks.
"""

from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

_RECENT_CALLS: List[Dict[str, Any]] = []
_MAX_RECENT = 6


def last_decode_call() -> Optional[Dict[str, Any]]:
    """Cache arguments of the most recent decode call, or None."""
    return _RECENT_CALLS[-1] if _RECENT_CALLS else None


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_gate(a, A_log, dt_bias, num_v_heads: int, lower_bound: Optional[float] = None) -> torch.Tensor:
    """Float32 log-decays ``[..., HV, K]`` of the gate inputs ``a [..., HV * K]``."""
    x = a.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().view(num_v_heads, -1)
    rate = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def replay(checkpoint, deltas, keys, log_decays, count: int, group: int) -> torch.Tensor:
    """Float32 state ``[HV, V, K]`` after replaying ``count`` ring rows onto ``checkpoint``."""
    state = checkpoint.float()
    if count == 0:
        return state.clone()
    cum = log_decays[:, :count].float().cumsum(1)
    last = cum[:, -1:]
    weights = keys[:, :count].float().repeat_interleave(group, 0) * torch.exp(last - cum)
    rows = torch.einsum("hjv,hjk->hvk", deltas[:, :count].float(), weights)
    return state * last.exp() + rows


def replayssm_kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    write_pos: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: Optional[float] = None,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """One token per row on slot ``slot_idx[i]`` (-1: padding); ``q, k [B, H, K]``,
    ``v [B, HV, V]``, ``a [B, HV * K]``, ``b [B, HV]``. Returns ``[B, HV, V]`` in ``v``'s dtype."""
    for name, ring in (("state", state), ("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        if ring.dim() != 4:
            raise ValueError(f"{name} must be 4-d, got {tuple(ring.shape)}")
    _RECENT_CALLS.append(
        {"state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache,
         "slot_idx": slot_idx, "write_pos": write_pos}
    )
    del _RECENT_CALLS[:-_MAX_RECENT]

    rows = q.shape[0]
    num_v_heads, ring_len, _ = d_cache.shape[1:]
    num_heads, head_dim = k_cache.shape[1], k_cache.shape[-1]
    group = num_v_heads // num_heads
    scale = head_dim**-0.5 if scale is None else scale
    g = kda_gate(a.reshape(rows, -1), A_log, dt_bias, num_v_heads, lower_bound)
    beta = torch.sigmoid(b.float())
    keys = l2norm(k.float())
    queries = l2norm(q.float()).repeat_interleave(group, 1) * scale
    values = v.float()
    out = torch.zeros(v.shape, dtype=v.dtype)
    for row in range(rows):
        slot = int(slot_idx[row])
        if slot < 0:
            continue
        pos = int(write_pos[slot])
        s = replay(state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        s = s * g[row].exp().unsqueeze(1)
        key = keys[row].repeat_interleave(group, 0)
        delta = beta[row].unsqueeze(-1) * (values[row] - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        out[row] = torch.einsum("hvk,hk->hv", s, queries[row])
        if pos == ring_len - 1:
            state[slot] = s
            write_pos[slot] = 0
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = keys[row]
            g_cache[slot, :, pos] = g[row]
            write_pos[slot] = pos + 1
    return out


def build_reference_decode() -> Dict[str, torch.Tensor]:
    """Six steps on three slots (one padding row) with bf16 delta/key rings."""
    gen = torch.Generator().manual_seed(0)
    slots, h, hv, dim, ring = 3, 2, 4, 8, 4
    caches = {
        "state": torch.zeros(slots, hv, dim, dim, dtype=torch.float32),
        "d_cache": torch.zeros(slots, hv, ring, dim, dtype=torch.bfloat16),
        "k_cache": torch.zeros(slots, h, ring, dim, dtype=torch.bfloat16),
        "g_cache": torch.zeros(slots, hv, ring, dim, dtype=torch.float32),
        "write_pos": torch.zeros(slots, dtype=torch.int32),
    }
    slot_idx = torch.tensor([2, -1, 0], dtype=torch.int32)
    A_log = torch.linspace(-1.0, 0.5, hv)
    dt_bias = torch.zeros(hv * dim)
    outs = []
    for _ in range(6):
        q, k = (torch.randn(3, h, dim, generator=gen).bfloat16() for _ in range(2))
        v = torch.randn(3, hv, dim, generator=gen).bfloat16()
        a = torch.randn(3, hv * dim, generator=gen).bfloat16()
        b = torch.randn(3, hv, generator=gen).bfloat16()
        outs.append(replayssm_kda_decode(q, k, v, a, b, slot_idx=slot_idx, A_log=A_log, dt_bias=dt_bias, **caches))
    return {**caches, "out": torch.stack(outs)}
