"""Reference PyTorch ops for ReplaySSM on KDA layers.

A decode slot keeps a checkpoint state ``S[slot, HV, V, K]`` plus three rings of ``L`` rows: the
deltas ``d[slot, HV, L, V]``, the normalised keys ``k[slot, H, L, K]`` and the per-step
log-decays ``g[slot, HV, L, K]``. A step rebuilds the state from the checkpoint and the ring rows
before its cursor, appends one row, and rewrites the checkpoint once every ``L`` steps (or when a
flush is forced). The gate ring must be float32: its prefix sums become the exponents of the decays.

These ops compute in float32 whatever they are given and write back in the dtype of each buffer.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F


def _check(name: str, tensor: torch.Tensor, shape: Tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}")


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_log_decay(
    a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: Optional[float] = None
) -> torch.Tensor:
    """float32 per-channel log-decay ``g[..., HV, K]`` from the gate pre-activations ``a[..., HV, K]``."""
    x = a.float() + dt_bias.float()
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(x)
    return lower_bound * torch.sigmoid(A * x)


def next_write_pos(
    write_pos: torch.Tensor, ring_length: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Cursor after one step: 0 after a flush, else ``write_pos + 1``."""
    flush = write_pos == ring_length - 1
    if force_flush is not None:
        flush = flush | (force_flush != 0)
    return torch.where(flush, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)


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
    """One ReplaySSM decode step (sglang argument order); writes ``out`` and the caches in place."""
    num_slots, HV, V, K = initial_state.shape
    H, L = k_cache.shape[1], d_cache.shape[2]
    batch = mixed_qkv.shape[0]
    _check("mixed_qkv", mixed_qkv, (batch, 2 * H * K + HV * V))
    _check("d_cache", d_cache, (num_slots, HV, L, V))
    _check("k_cache", k_cache, (num_slots, H, L, K))
    _check("g_cache", g_cache, (num_slots, HV, L, K))
    _check("out", out, (batch, 1, HV, V))
    _check("b", b, (batch, HV))
    group = HV // H

    g = kda_log_decay(a.reshape(batch, HV, K), A_log, dt_bias.reshape(HV, K), lower_bound)
    beta = torch.sigmoid(b).float()
    x = mixed_qkv.float()
    q = x[:, : H * K].reshape(batch, H, K)
    k = x[:, H * K : 2 * H * K].reshape(batch, H, K)
    v = x[:, 2 * H * K :].reshape(batch, HV, V)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * scale

    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        c = int(write_pos[row])
        flush = c == L - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        kh = k[row].repeat_interleave(group, dim=0)
        qh = q[row].repeat_interleave(group, dim=0)
        S = initial_state[slot].float()
        if c > 0:
            G = g_cache[slot, :, :c].float().cumsum(dim=1)
            G_T = G[:, -1]
            k_rows = k_cache[slot, :, :c].float().repeat_interleave(group, dim=0)
            d_rows = d_cache[slot, :, :c].float()
            S = S * G_T.exp()[:, None, :] + torch.einsum(
                "hjv,hjk->hvk", d_rows, (G_T[:, None, :] - G).exp() * k_rows
            )
        alpha = g[row].exp()
        state_q = torch.einsum("hvk,hk->hv", S, alpha * qh)
        state_k = torch.einsum("hvk,hk->hv", S, alpha * kh)
        delta = beta[row][:, None] * (v[row] - state_k)
        out[row, 0] = state_q + delta * (kh * qh).sum(-1, keepdim=True)
        if flush:
            initial_state[slot] = S * alpha[:, None, :] + delta[:, :, None] * kh[:, None, :]
        else:
            d_cache[slot, :, c] = delta
            g_cache[slot, :, c] = g[row]
            k_cache[slot, :, c] = k[row]
    return out, initial_state


def replay_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ring_length: int,
    state_dtype: torch.dtype,
    ring_dtype: torch.dtype,
) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], int]:
    """Run the KDA recurrence over a prompt and lay its end out as ReplaySSM decode would have.

    Args: ``q`` (scaled) and ``k`` (normalised) ``[s, b, H, K]``, ``v [s, b, HV, V]``, the
    log-decays ``g [s, b, HV, K]`` and ``beta [s, b, HV]``.

    Returns the outputs ``[s, b, HV, V]`` (float32), the (state, delta ring, key ring, gate ring)
    of the ``b`` sequences and the cursor: the state is the checkpoint after the last multiple of
    ``ring_length`` tokens and the rings hold the tokens after it. The gate ring keeps the dtype of
    ``g``; the other rings are in ``ring_dtype``.
    """
    seqlen, batch, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    n_tail = seqlen % ring_length
    S = torch.zeros(batch, HV, V, K, dtype=torch.float32, device=k.device)
    checkpoint = S.clone()
    outputs: List[torch.Tensor] = []
    deltas: List[torch.Tensor] = []
    for t in range(seqlen):
        alpha = g[t].float().exp()
        kh = k[t].float().repeat_interleave(group, dim=1)
        qh = q[t].float().repeat_interleave(group, dim=1)
        S = S * alpha[:, :, None, :]
        delta = beta[t].float()[..., None] * (v[t].float() - torch.einsum("bhvk,bhk->bhv", S, kh))
        S = S + delta[..., None] * kh[:, :, None, :]
        outputs.append(torch.einsum("bhvk,bhk->bhv", S, qh))
        if t == seqlen - n_tail - 1:
            checkpoint = S.clone()
        if t >= seqlen - n_tail:
            deltas.append(delta)

    state = checkpoint.to(state_dtype)
    delta_ring = torch.zeros(batch, HV, ring_length, V, dtype=ring_dtype, device=k.device)
    key_ring = torch.zeros(batch, H, ring_length, K, dtype=ring_dtype, device=k.device)
    if n_tail:
        delta_ring[:, :, :n_tail] = torch.stack(deltas, dim=2)
        key_ring[:, :, :n_tail] = k[seqlen - n_tail :].permute(1, 2, 0, 3)
    gate_ring = F.pad(g[seqlen - n_tail :].permute(1, 2, 0, 3), (0, 0, 0, ring_length - n_tail))
    return torch.stack(outputs), (state, delta_ring, key_ring, gate_ring), n_tail
