"""ReplaySSM decode for KDA: the torch fallback of the fused kernel.

One token per request. Instead of reading and writing the whole state every step, the kernel
rebuilds it from the slot's checkpoint and the ring rows before the cursor, appends one ring
row, and writes the state back only when the ring is full (or a flush is forced).
The fused kernel takes the same arguments in the same order (sglang-compatible).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _expect(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}")


def replay_ssm_decode(
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
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes ``out`` always, ``initial_state`` on flush, ring row ``write_pos`` otherwise.

    ``g_cache`` is float32 in the fused kernel. This fallback upcasts whatever it is given
    (so that it can be used to measure what a 16-bit gate ring costs) and writes back in the
    ring's own dtype.
    """
    num_reqs = mixed_qkv.shape[0]
    num_slots, HV, V, K = initial_state.shape
    H = k_cache.shape[1]
    L = d_cache.shape[2]
    if HV % H:
        raise ValueError(f"k_cache: {H} key heads do not divide {HV} value heads")
    _expect("mixed_qkv", mixed_qkv, (num_reqs, 2 * H * K + HV * V))
    _expect("d_cache", d_cache, (num_slots, HV, L, V))
    _expect("k_cache", k_cache, (num_slots, H, L, K))
    _expect("g_cache", g_cache, (num_slots, HV, L, K))
    _expect("out", out, (num_reqs, 1, HV, V))
    if not g_cache.is_floating_point():
        raise ValueError(f"g_cache: expected a floating point tensor, got {g_cache.dtype}")
    if ssm_state_indices.dtype != torch.int32 or write_pos.dtype != torch.int32:
        raise ValueError(
            f"ssm_state_indices/write_pos: expected int32, got {ssm_state_indices.dtype}/{write_pos.dtype}"
        )
    group = HV // H
    heads = torch.arange(HV, device=mixed_qkv.device) // group
    a = a.reshape(num_reqs, HV, K).float()
    dt_bias = dt_bias.reshape(HV, K).float()
    A = A_log.float().exp()[:, None]
    for row in range(num_reqs):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        x = mixed_qkv[row].float()
        q = x[: H * K].view(H, K)
        k = x[H * K : 2 * H * K].view(H, K)
        v = x[2 * H * K :].view(HV, V)
        if use_qk_l2norm_in_kernel:
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q_s = q * scale
        gate_in = a[row] + dt_bias
        if lower_bound is None:
            g = -A * F.softplus(gate_in)
        else:
            g = lower_bound * torch.sigmoid(A * gate_in)
        alpha = g.exp()
        beta = torch.sigmoid(b[row].float())
        cursor = int(write_pos[row])
        flush = cursor == L - 1 or (force_flush is not None and int(force_flush[row]) != 0)

        q_h, k_h = q_s[heads], k[heads]
        S = initial_state[slot].float()
        if cursor:
            G = g_cache[slot, :, :cursor].float().cumsum(dim=1)
            G_T = G[:, -1]
            decay = (G_T[:, None, :] - G).exp() * k_cache[slot, heads, :cursor].float()
            S = S * G_T.exp()[:, None, :] + torch.einsum("hcv,hck->hvk", d_cache[slot, :, :cursor].float(), decay)
        S = S * alpha[:, None, :]
        state_q = torch.einsum("hvk,hk->hv", S, q_h)
        state_k = torch.einsum("hvk,hk->hv", S, k_h)
        delta = beta[:, None] * (v - state_k)
        out[row, 0] = (state_q + delta * (k_h * q_h).sum(-1, keepdim=True)).to(out.dtype)
        if flush:
            initial_state[slot] = (S + delta[:, :, None] * k_h[:, None, :]).to(initial_state.dtype)
        else:
            d_cache[slot, :, cursor] = delta.to(d_cache.dtype)
            g_cache[slot, :, cursor] = g.to(g_cache.dtype)
            k_cache[slot, :, cursor] = k.to(k_cache.dtype)
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The cursors after one step: 0 after a flush, else one more."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed |= force_flush != 0
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1)


def kda_recurrent_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain KDA recurrence for one token of one sequence, [HV, V, K] state, fp32."""
    alpha = g.exp()
    S = state * alpha[:, None, :]
    delta = beta[:, None] * (v - torch.einsum("hvk,hk->hv", S, k))
    S = S + delta[:, :, None] * k[:, None, :]
    return torch.einsum("hvk,hk->hv", S, q * scale), S


def build_replay_matches_recurrence():
    """Six steps of ReplaySSM (one forced flush) next to the plain recurrence, fp32 pool."""
    torch.manual_seed(0)
    num_slots, H, HV, K, V, L = 2, 2, 2, 4, 4, 4
    scale = K**-0.5
    initial_state = torch.zeros((num_slots, HV, V, K), dtype=torch.float32)
    d_cache = torch.zeros((num_slots, HV, L, V), dtype=torch.float32)
    k_cache = torch.zeros((num_slots, H, L, K), dtype=torch.float32)
    g_cache = torch.zeros((num_slots, HV, L, K), dtype=torch.float32)
    A_log = torch.randn(HV, dtype=torch.float32) * 0.1
    dt_bias = torch.randn(HV * K, dtype=torch.float32) * 0.1
    slots = torch.tensor([1], dtype=torch.int32)
    write_pos = torch.zeros(1, dtype=torch.int32)
    reference = torch.zeros((HV, V, K), dtype=torch.float32)
    outs, ref_outs = [], []
    for step in range(6):
        mixed_qkv = torch.randn(1, 2 * H * K + HV * V)
        a = torch.randn(1, HV * K)
        b = torch.randn(1, HV)
        force = torch.tensor([int(step == 1)], dtype=torch.int32)
        out = torch.empty((1, 1, HV, V), dtype=torch.float32)
        replay_ssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, scale,
            initial_state, d_cache, k_cache, g_cache, out,
            slots, write_pos, force, use_qk_l2norm_in_kernel=True,
        )
        write_pos = advance_write_pos(write_pos, L, force)
        outs.append(out[0, 0])
        x = mixed_qkv[0]
        q = F.normalize(x[: H * K].view(H, K), dim=-1, eps=1e-6)
        k = F.normalize(x[H * K : 2 * H * K].view(H, K), dim=-1, eps=1e-6)
        g = -A_log.exp()[:, None] * F.softplus(a.view(HV, K) + dt_bias.view(HV, K))
        o, reference = kda_recurrent_step(
            reference, q, k, x[2 * H * K :].view(HV, V), g, torch.sigmoid(b[0]), scale
        )
        ref_outs.append(o)
    return {
        "replay": KDAReplayRings(initial_state, d_cache, k_cache, g_cache),
        "outputs": torch.stack(outs),
        "reference_outputs": torch.stack(ref_outs),
        "max_abs_err": (torch.stack(outs) - torch.stack(ref_outs)).abs().max().reshape(1),
    }


class KDAReplayRings:
    """Loose tensors of one pool, for the self-check above."""

    def __init__(self, initial_state, d_cache, k_cache, g_cache):
        self.initial_state = initial_state
        self.d_cache = d_cache
        self.k_cache = k_cache
        self.g_cache = g_cache
