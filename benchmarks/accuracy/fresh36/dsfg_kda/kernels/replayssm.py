"""ReplaySSM decode for Kimi Delta Attention: the reference implementation (CPU, any ring
dtype) of the fused kernel, with the same signature and in-place contract.

A slot owns a float32 checkpoint ``S [HV, V, K]`` and the rows written since it: deltas
``d [HV, L, V]``, keys ``k [H, L, K]`` and per-channel log-decays ``g [HV, L, K]``. The state
after ``n`` rows is rebuilt from prefix sums of the log-decays::

    G_j = g_1 + ... + g_j
    S_n = exp(G_n) * S + sum_j d_j (k_j * exp(G_n - G_j))^T

A decode step rebuilds ``S_pos``, applies the new token (decay, delta rule), writes its
delta/key/log-decay at ``write_pos`` and, on the last row of the ring, folds the ring into the
checkpoint and starts over at row 0.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def kda_gate(g: Tensor, A_log: Tensor, dt_bias: Tensor, num_v_heads: int) -> Tensor:
    """Per-channel log-decays ``-exp(A_log) * softplus(g + dt_bias)``, float32 ``[..., HV, K]``."""
    x = g.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().view(num_v_heads, -1)
    return -A_log.float().exp().unsqueeze(-1) * F.softplus(x)


def _replay(state: Tensor, d_rows: Tensor, k_rows: Tensor, g_rows: Tensor, n_rows: int, group: int) -> Tensor:
    """``S_n`` of one slot from its checkpoint and the first ``n_rows`` ring rows (float32)."""
    s = state.float()
    if n_rows == 0:
        return s.clone()
    cum = g_rows[:, :n_rows].float().cumsum(dim=1)
    total = cum[:, -1]
    keys = k_rows[:, :n_rows].float().repeat_interleave(group, dim=0) * torch.exp(total.unsqueeze(1) - cum)
    return s * total.exp().unsqueeze(1) + torch.einsum("hnv,hnk->hvk", d_rows[:, :n_rows].float(), keys)


def fused_recurrent_kda_replayssm_decode(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    *,
    initial_state: Tensor,
    d_cache: Tensor,
    k_cache: Tensor,
    g_cache: Tensor,
    write_pos: Tensor,
    slot_ids: Tensor,
    use_qk_l2norm_in_kernel: bool = True,
    out: Optional[Tensor] = None,
) -> Tensor:
    """One token for each of ``B`` rows; row ``i`` runs on slot ``slot_ids[i]`` (negative: padding).

    ``q, k [B, H, K]``, ``v [B, HV, V]``, ``g [B, HV, K]`` (log-decays), ``beta [B, HV]``;
    ``initial_state [S, HV, V, K]``, ``d_cache [S, HV, L, V]``, ``k_cache [S, H, L, K]``,
    ``g_cache [S, HV, L, K]``, ``write_pos`` int32 ``[S]`` are updated in place.
    Returns ``out [B, HV, V]`` in the dtype of ``v``.
    """
    rows, num_heads, head_k = q.shape
    num_v_heads, ring_len, head_v = d_cache.shape[1:]
    group = num_v_heads // num_heads
    scale = head_k**-0.5 if scale is None else scale
    qf, kf = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        qf, kf = F.normalize(qf, dim=-1), F.normalize(kf, dim=-1)
    if out is None:
        out = v.new_zeros(rows, num_v_heads, head_v)
    for i in range(rows):
        slot = int(slot_ids[i])
        if slot < 0:
            out[i].zero_()
            continue
        pos = int(write_pos[slot])
        s = _replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = kf[i].repeat_interleave(group, dim=0)
        s = s * g[i].float().exp().unsqueeze(1)
        delta = beta[i].float().unsqueeze(-1) * (v[i].float() - torch.einsum("hvk,hk->hv", s, key))
        d_cache[slot, :, pos] = delta
        k_cache[slot, :, pos] = kf[i]
        g_cache[slot, :, pos] = g[i]
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        out[i] = torch.einsum("hvk,hk->hv", s, qf[i].repeat_interleave(group, dim=0) * scale)
        if pos + 1 == ring_len:
            initial_state[slot] = _replay(
                initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], ring_len, group
            )
            write_pos[slot] = 0
        else:
            write_pos[slot] = pos + 1
    return out


def recurrent_kda_rows(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ring rows a prompt of ``T < L`` tokens leaves in an empty slot.

    ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g [T, HV, K]``, ``beta [T, HV]``. Returns
    ``(deltas [HV, T, V], keys [H, T, K], out [T, HV, V])`` in float32.
    """
    steps, num_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    group = num_v_heads // num_heads
    scale = head_k**-0.5 if scale is None else scale
    qf, kf = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
    s = torch.zeros(num_v_heads, head_v, head_k, dtype=torch.float32, device=q.device)
    deltas, outs = [], []
    for t in range(steps):
        key = kf[t].repeat_interleave(group, dim=0)
        s = s * g[t].float().exp().unsqueeze(1)
        delta = beta[t].float().unsqueeze(-1) * (v[t].float() - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        outs.append(torch.einsum("hvk,hk->hv", s, qf[t].repeat_interleave(group, dim=0) * scale))
        deltas.append(delta)
    return torch.stack(deltas, dim=1), kf.transpose(0, 1).contiguous(), torch.stack(outs)


def build_reference_decode() -> Dict[str, Tensor]:
    """Seven launches of three rows (one padding) on three slots: bf16 delta/key rings, float32
    log-decay ring; slot 2 and slot 0 fold their rings into the checkpoint."""
    torch.manual_seed(0)
    slots, h, hv, dk, dv, ring_len = 3, 2, 4, 8, 8, 4
    rings = {
        "initial_state": torch.zeros(slots, hv, dv, dk, dtype=torch.float32),
        "d_cache": torch.zeros(slots, hv, ring_len, dv, dtype=torch.bfloat16),
        "k_cache": torch.zeros(slots, h, ring_len, dk, dtype=torch.bfloat16),
        "g_cache": torch.zeros(slots, hv, ring_len, dk, dtype=torch.float32),
        "write_pos": torch.zeros(slots, dtype=torch.int32),
    }
    slot_ids = torch.tensor([2, -1, 0], dtype=torch.int32)
    A_log, dt_bias = torch.linspace(-1.0, 0.5, hv), torch.linspace(-0.5, 0.5, hv * dk)
    outs = []
    for _ in range(7):
        q, k = torch.randn(2, 3, h, dk, dtype=torch.bfloat16)
        v = torch.randn(3, hv, dv, dtype=torch.bfloat16)
        g = kda_gate(torch.randn(3, hv * dk, dtype=torch.bfloat16), A_log, dt_bias, hv)
        beta = torch.randn(3, hv, dtype=torch.bfloat16).sigmoid()
        outs.append(fused_recurrent_kda_replayssm_decode(q, k, v, g, beta, slot_ids=slot_ids, **rings))
    return {**rings, "out": torch.stack(outs)}
