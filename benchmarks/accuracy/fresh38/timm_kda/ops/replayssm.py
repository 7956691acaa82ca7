""" ReplaySSM decode for Kimi Delta Attention, pure PyTorch reference

The CUDA extension (``timm_kda._C``) registers a fused kernel with the same name and the same
in-place contract; this module is what runs when the extension is not built (and on CPU).

Per cache slot the kernel keeps a float32 checkpoint ``initial_state[slot] (HV, V, K)`` and the
rows written since that checkpoint in three rings of length ``L``:

    d_cache  (slots, HV, L, V)   delta rows        model dtype
    k_cache  (slots, H,  L, K)   key rows          model dtype
    g_cache  (slots, HV, L, K)   per-step log-decay float32 (prefix-summed, then exponentiated)

A step replays ``write_pos`` rows onto the checkpoint, applies the new token and writes its rows
at ``write_pos``. On the last ring row the state is folded into the checkpoint instead. The
caller moves ``write_pos`` on afterwards (see ``advance_write_pos``).

Hacked together by / Copyright 2025, timm_kda authors
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ['fused_recurrent_kda_replayssm_decode', 'advance_write_pos', 'chunk_kda']


def _replay_rows(state: torch.Tensor, d_rows, k_rows, g_rows, n: int, rep: int) -> torch.Tensor:
    if n == 0:
        return state.float().clone()
    g_cum = g_rows[:, :n].float().cumsum(dim=1)                     # HV, n, K
    g_tot = g_cum[:, -1:]                                             # HV, 1, K
    k_dec = k_rows[:, :n].float().repeat_interleave(rep, dim=0) * torch.exp(g_tot - g_cum)
    return state.float() * g_tot.exp() + d_rows[:, :n].float().transpose(1, 2) @ k_dec


def fused_recurrent_kda_replayssm_decode(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: Optional[float] = None,
        initial_state: Optional[torch.Tensor] = None,
        d_cache: Optional[torch.Tensor] = None,
        k_cache: Optional[torch.Tensor] = None,
        g_cache: Optional[torch.Tensor] = None,
        ssm_state_indices: Optional[torch.Tensor] = None,
        write_pos: Optional[torch.Tensor] = None,
        use_qk_l2norm_in_kernel: bool = False,
        out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """ One decode token per batch row.

    Args:
        q, k: (B, 1, H, K)
        v: (B, 1, HV, V)
        g: (B, 1, HV, K) log-decays of the new token
        beta: (B, 1, HV)
        ssm_state_indices: int32 (B,), slot of each row, negative for padding rows
        write_pos: int32 (B,), ring row of each row's slot

    Returns:
        (B, 1, HV, V) in the dtype of ``v``
    """
    if initial_state is None or d_cache is None or k_cache is None or g_cache is None:
        raise ValueError('ReplaySSM decode needs initial_state, d_cache, k_cache and g_cache')
    B, _, H, K = q.shape
    HV, L, V = d_cache.shape[1:]
    rep = HV // H
    scale = K ** -0.5 if scale is None else scale
    if ssm_state_indices is None:
        ssm_state_indices = torch.arange(B, dtype=torch.int32, device=q.device)
    if write_pos is None:
        write_pos = torch.zeros(B, dtype=torch.int32, device=q.device)
    if out is None:
        out = v.new_zeros(B, 1, HV, V)

    with torch.autocast(device_type=q.device.type, enabled=False):
        qf, kf = q[:, 0].float(), k[:, 0].float()
        if use_qk_l2norm_in_kernel:
            qf, kf = F.normalize(qf, dim=-1), F.normalize(kf, dim=-1)
        qf = qf * scale
        for b in range(B):
            slot = int(ssm_state_indices[b])
            if slot < 0:
                out[b].zero_()
                continue
            pos = int(write_pos[b])
            s = _replay_rows(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, rep)
            k_t = kf[b].repeat_interleave(rep, dim=0)                # HV, K
            s = s * g[b, 0].float().exp().unsqueeze(1)
            delta = beta[b, 0].float().unsqueeze(-1) * (v[b, 0].float() - (s @ k_t.unsqueeze(-1)).squeeze(-1))
            s = s + delta.unsqueeze(-1) * k_t.unsqueeze(1)
            out[b, 0] = (s @ qf[b].repeat_interleave(rep, dim=0).unsqueeze(-1)).squeeze(-1)
            if pos == L - 1:
                initial_state[slot] = s
            else:
                d_cache[slot, :, pos] = delta
                k_cache[slot, :, pos] = kf[b]
                g_cache[slot, :, pos] = g[b, 0]
    return out


def advance_write_pos(ring_pos: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor, ring_len: int):
    """ Move each live row's slot one ring row on (back to 0 after a fold). """
    live = ssm_state_indices >= 0
    slots = ssm_state_indices[live].long()
    ring_pos[slots] = ((write_pos[live] + 1) % ring_len).to(ring_pos.dtype)


def chunk_kda(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: Optional[float] = None,
        use_qk_l2norm: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ Full sequences (B, T, ...) from a zero state, the training / prompt path.

    Returns ``(o (B, T, HV, V) in v.dtype, deltas (B, HV, T, V) float32, keys (B, H, T, K) float32)``,
    the rows a prompt of ``T < L`` tokens leaves in an empty slot.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    rep = HV // H
    scale = K ** -0.5 if scale is None else scale
    with torch.autocast(device_type=q.device.type, enabled=False):
        qf, kf = q.float(), k.float()
        if use_qk_l2norm:
            qf, kf = F.normalize(qf, dim=-1), F.normalize(kf, dim=-1)
        qf = qf * scale
        s = q.new_zeros(B, HV, V, K, dtype=torch.float32)
        outs, deltas = [], []
        for t in range(T):
            k_t = kf[:, t].repeat_interleave(rep, dim=1)
            s = s * g[:, t].float().exp().unsqueeze(2)
            delta = beta[:, t].float().unsqueeze(-1) * (v[:, t].float() - (s @ k_t.unsqueeze(-1)).squeeze(-1))
            s = s + delta.unsqueeze(-1) * k_t.unsqueeze(2)
            outs.append((s @ qf[:, t].repeat_interleave(rep, dim=1).unsqueeze(-1)).squeeze(-1))
            deltas.append(delta)
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, torch.stack(deltas, dim=2), kf.transpose(1, 2)


def build_reference_decode():
    """ Seven steps of three rows (one padding) on a two-slot cache; bf16 d/k rings, so slot 1
    folds once. """
    torch.manual_seed(0)
    slots, H, HV, K, L = 2, 2, 4, 8, 4
    state = torch.zeros(slots, HV, K, K, dtype=torch.float32)
    d_cache = torch.zeros(slots, HV, L, K, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, H, L, K, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, HV, L, K, dtype=torch.float32)
    ring_pos = torch.zeros(slots, dtype=torch.int32)
    idx = torch.tensor([1, -1, 0], dtype=torch.int32)
    outs = []
    for _ in range(7):
        q = torch.randn(3, 1, H, K, dtype=torch.bfloat16)
        k = torch.randn(3, 1, H, K, dtype=torch.bfloat16)
        v = torch.randn(3, 1, HV, K, dtype=torch.bfloat16)
        g = -F.softplus(torch.randn(3, 1, HV, K))
        beta = torch.rand(3, 1, HV)
        pos = ring_pos[idx.clamp(min=0).long()]
        outs.append(fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta, initial_state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
            ssm_state_indices=idx, write_pos=pos, use_qk_l2norm_in_kernel=True))
        advance_write_pos(ring_pos, idx, pos, L)
    return dict(initial_state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, ring_pos=ring_pos, out=torch.stack(outs))
