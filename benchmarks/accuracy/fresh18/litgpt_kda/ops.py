# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Reference PyTorch implementation of the ReplaySSM decode step for Kimi Delta Attention.

The signature follows the fused kernel (``fused_recurrent_kda_replayssm_decode``), so the model
code can switch implementations without touching its call sites.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: Optional[float] = None
) -> torch.Tensor:
    """Per-channel log-decay ``g`` of one step, in float32.

    ``a`` is ``[..., HV, K]``, ``A_log`` is ``[HV]`` and ``dt_bias`` is ``[HV, K]``.
    """
    x = a.float() + dt_bias.float()
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(x)
    return lower_bound * torch.sigmoid(A * x)


def _check(name: str, tensor: torch.Tensor, shape: Tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(tensor.shape)}")


def kda_replay_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decode step of every row of the batch.

    The state of a slot is its checkpoint ``initial_state[slot]`` replayed through the ring rows
    before the row's cursor. A step either appends one row to the rings or, when the ring is full
    (or ``force_flush`` is set), writes the new state back into the checkpoint. All math runs in
    float32; results are stored into the given tensors with ``copy_``.

    Returns ``(out, initial_state)``.
    """
    B = mixed_qkv.shape[0]
    n_slots, HV, V, K = initial_state.shape
    H = k_cache.shape[1]
    L = d_cache.shape[2]
    if HV % H != 0:
        raise ValueError(f"k_cache: {H} key heads do not divide {HV} value heads")
    group = HV // H
    _check("mixed_qkv", mixed_qkv, (B, 2 * H * K + HV * V))
    _check("d_cache", d_cache, (n_slots, HV, L, V))
    _check("k_cache", k_cache, (n_slots, H, L, K))
    _check("g_cache", g_cache, (n_slots, HV, L, K))
    _check("out", out, (B, 1, HV, V))
    _check("write_pos", write_pos, (B,))

    qkv = mixed_qkv.float()
    q = qkv[:, : H * K].view(B, H, K)
    k = qkv[:, H * K : 2 * H * K].view(B, H, K)
    v = qkv[:, 2 * H * K :].view(B, HV, V)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = kda_gate(a.reshape(B, HV, K), A_log, dt_bias.reshape(HV, K), lower_bound)
    beta = torch.sigmoid(b.float().view(B, HV))

    for row in range(B):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        c = int(write_pos[row])
        flush = c == L - 1 or (force_flush is not None and int(force_flush[row]) != 0)

        S = initial_state[slot].float()  # [HV, V, K]
        if c > 0:
            G = g_cache[slot, :, :c].float().cumsum(1)  # [HV, c, K]
            G_T = G[:, -1]
            keys = k_cache[slot, :, :c].float().repeat_interleave(group, dim=0)
            weights = torch.exp(G_T[:, None] - G) * keys
            S = S * torch.exp(G_T)[:, None, :] + torch.einsum(
                "hcv,hck->hvk", d_cache[slot, :, :c].float(), weights
            )

        kh = k[row].repeat_interleave(group, dim=0)  # [HV, K]
        qh = scale * q[row].repeat_interleave(group, dim=0)
        S = S * g[row].exp()[:, None, :]
        delta = beta[row][:, None] * (v[row] - torch.einsum("hvk,hk->hv", S, kh))
        o = torch.einsum("hvk,hk->hv", S, qh) + delta * (kh * qh).sum(-1, keepdim=True)
        out[row, 0].copy_(o)

        if flush:
            initial_state[slot].copy_(S + delta[:, :, None] * kh[:, None, :])
        else:
            d_cache[slot, :, c].copy_(delta)
            g_cache[slot, :, c].copy_(g[row])
            k_cache[slot, :, c].copy_(k[row])
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Cursors after one step: ``0`` after a flush, else one further."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)
