"""ReplaySSM decode for Kimi Delta Attention: a pure PyTorch reference of the fused kernel.

Per slot, a replay cache holds a float32 checkpoint ``S [HV, V, K]`` and the rows written since
that checkpoint in three rings of length ``L``: deltas ``d_cache [slots, HV, L, V]``, keys
``k_cache [slots, H, L, K]`` and per-channel log-decays ``g_cache [slots, HV, L, K]``, plus the
int32 ``write_pos [slots]`` of the next row. A decode step rebuilds the state from the checkpoint
and the first ``write_pos`` rows (prefix sums of the log-decays, exponentiated), applies the
token, writes its rows at ``write_pos`` and, when that was the last row, folds the ring into the
checkpoint. Rings may be any floating dtype; all math is float32.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """Per-channel log-decays ``-exp(A_log) * softplus(f + dt_bias)``: ``[..., HV, K]``, float32."""
    f = f.float().unflatten(-1, (num_v_heads, -1))
    return -A_log.float().exp().unsqueeze(-1) * F.softplus(f + dt_bias.float().view(num_v_heads, -1))


def replay_state(
    state: torch.Tensor, d_rows: torch.Tensor, k_rows: torch.Tensor, g_rows: torch.Tensor, count: int, group: int
) -> torch.Tensor:
    """The state after the first ``count`` rows of one slot's rings on top of ``state [HV, V, K]``."""
    s = state.float()
    if count == 0:
        return s.clone()
    cum = g_rows[:, :count].float().cumsum(dim=1)
    total = cum[:, -1]
    keys = k_rows[:, :count].float().repeat_interleave(group, dim=0)
    weights = torch.exp(total.unsqueeze(1) - cum) * keys
    return s * total.exp().unsqueeze(1) + torch.einsum("hnv,hnk->hvk", d_rows[:, :count].float(), weights)


def fused_recurrent_kda_replayssm_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    *,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    write_pos: torch.Tensor,
    slot_mapping: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
) -> torch.Tensor:
    """One token for each of ``B`` rows, in place on the slots' checkpoints, rings and positions.

    ``q, k [B, H, K]``, ``v [B, HV, V]``, ``g [B, HV, K]`` (this step's log-decays), ``beta [B, HV]``;
    row ``i`` runs on slot ``slot_mapping[i]`` (default ``i``; negative: a padding row). Returns
    ``o [B, HV, V]`` in the dtype of ``v``.
    """
    batch, num_heads, head_k_dim = q.shape
    num_v_heads, ring_len, head_v_dim = d_cache.shape[1:]
    group = num_v_heads // num_heads
    scale = head_k_dim**-0.5 if scale is None else scale
    if slot_mapping is None:
        slot_mapping = torch.arange(batch, dtype=torch.int32)
    qf, kf = (F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)) if use_qk_l2norm_in_kernel else (q.float(), k.float())
    qf = qf * scale
    o = torch.zeros(batch, num_v_heads, head_v_dim, dtype=torch.float32)
    for i in range(batch):
        slot = int(slot_mapping[i])
        if slot < 0:
            continue
        pos = int(write_pos[slot])
        s = replay_state(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = kf[i].repeat_interleave(group, dim=0)
        s = s * g[i].float().exp().unsqueeze(1)
        delta = beta[i].float().unsqueeze(-1) * (v[i].float() - torch.einsum("hvk,hk->hv", s, key))
        d_cache[slot, :, pos] = delta
        k_cache[slot, :, pos] = kf[i]
        g_cache[slot, :, pos] = g[i]
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        o[i] = torch.einsum("hvk,hk->hv", s, qf[i].repeat_interleave(group, dim=0))
        if pos == ring_len - 1:
            # ring full: the checkpoint absorbs the rows as stored
            initial_state[slot] = replay_state(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], ring_len, group)
            write_pos[slot] = 0
        else:
            write_pos[slot] = pos + 1
    return o.to(v.dtype)


def chunk_kda_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: Optional[float] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt of ``T`` tokens from an empty state: ``q, k [T, H, K]``, ``v [T, HV, V]``,
    ``g [T, HV, K]``, ``beta [T, HV]``. Returns the rows it leaves, ``deltas [HV, T, V]`` and
    ``keys [H, T, K]`` (float32), and ``o [T, HV, V]``."""
    steps, num_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[1:]
    group = num_v_heads // num_heads
    scale = head_k_dim**-0.5 if scale is None else scale
    qf = F.normalize(q.float(), dim=-1) * scale
    kf = F.normalize(k.float(), dim=-1)
    s = torch.zeros(num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32)
    deltas, outs = [], []
    for t in range(steps):
        key = kf[t].repeat_interleave(group, dim=0)
        s = s * g[t].float().exp().unsqueeze(1)
        delta = beta[t].float().unsqueeze(-1) * (v[t].float() - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        outs.append(torch.einsum("hvk,hk->hv", s, qf[t].repeat_interleave(group, dim=0)))
        deltas.append(delta)
    return torch.stack(deltas, dim=1), kf.transpose(0, 1).contiguous(), torch.stack(outs).to(v.dtype)


def build_reference_decode():
    """Seven steps of three rows (one padding) on four slots: bf16 delta/key rings, a float32
    log-decay ring and checkpoint, so that one slot folds its ring."""
    torch.manual_seed(0)
    slots, h, hv, k, v, ring = 4, 2, 4, 4, 4, 4
    state = torch.zeros(slots, hv, v, k, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring, v, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring, k, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32)
    write_pos = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.log(torch.linspace(1.0, 4.0, hv))
    dt_bias = torch.zeros(hv * k)
    slot_mapping = torch.tensor([3, -1, 0], dtype=torch.int32)
    outs = []
    for _ in range(7):
        q = torch.randn(3, h, k, dtype=torch.bfloat16)
        kk = torch.randn(3, h, k, dtype=torch.bfloat16)
        vv = torch.randn(3, hv, v, dtype=torch.bfloat16)
        f = torch.randn(3, hv * k, dtype=torch.bfloat16)
        beta = torch.rand(3, hv)
        g = kda_gate(f, A_log, dt_bias, hv)
        outs.append(
            fused_recurrent_kda_replayssm_decode(
                q, kk, vv, g, beta,
                initial_state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                write_pos=write_pos, slot_mapping=slot_mapping,
            )
        )
    return {"initial_state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache, "write_pos": write_pos, "o": torch.stack(outs)}
