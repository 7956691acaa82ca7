"""ReplaySSM decode of Kimi Delta Attention: the CPU reference of the fused kernel.

CUDA builds import the fused kernel from ``fla_replayssm``; everything else (and the unit
tests) runs this module, which keeps the kernel's argument names and in-place contract. Per
cache slot there is a checkpoint ``initial_state [slots, HV, V, K]`` and three rings of ``L``
rows: deltas ``d_cache [slots, HV, L, V]``, keys ``k_cache [slots, H, L, K]`` and per-step
log-decays ``g_cache [slots, HV, L, K]``. A step appends one row at ``write_pos``; when the
cursor reaches ``L - 1`` (or ``force_flush`` is set) the ring is folded into the checkpoint
instead. Replaying takes prefix sums of the log-decays and exponentiates them, which is why the
gate ring is kept in float32 whatever the model dtype is.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

_LAST_CALLS: List[Dict[str, Any]] = []
_KEEP = 4


def last_decode_call() -> Optional[Dict[str, Any]]:
    """The ring arguments of the latest decode call (kept by reference), or None."""
    return _LAST_CALLS[-1] if _LAST_CALLS else None


def reset_decode_log() -> None:
    _LAST_CALLS.clear()


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    num_v_heads: int,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Float32 log-decays ``[..., HV, K]`` from gate inputs ``a [..., HV*K]``."""
    x = a.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().view(num_v_heads, -1)
    rate = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def replay(
    checkpoint: torch.Tensor,
    deltas: torch.Tensor,
    keys: torch.Tensor,
    log_decays: torch.Tensor,
    rows: int,
    group: int,
) -> torch.Tensor:
    """``[HV, V, K]`` state after replaying ``rows`` ring rows onto ``checkpoint``."""
    state = checkpoint.float()
    if rows == 0:
        return state.clone()
    prefix = log_decays[:, :rows].float().cumsum(1)
    total = prefix[:, -1]
    k = keys[:, :rows].float().repeat_interleave(group, dim=0) * torch.exp(total.unsqueeze(1) - prefix)
    return state * total.exp().unsqueeze(1) + torch.einsum("hjv,hjk->hvk", deltas[:, :rows].float(), k)


def fused_recurrent_kda_replayssm_decode(
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
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token for each of ``B`` rows; row ``i`` lives in slot ``ssm_state_indices[i]``.

    ``mixed_qkv [B, 2*H*K + HV*V]``, ``a [B, HV*K]``, ``b [B, HV]``; ``write_pos [B]`` int32 is
    read only. Returns ``(out [B, 1, HV, V], initial_state)``.
    """
    for name, tensor in (("initial_state", initial_state), ("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be 4-d, got {tuple(tensor.shape)}")
    _LAST_CALLS.append(
        {
            "initial_state": initial_state,
            "d_cache": d_cache,
            "k_cache": k_cache,
            "g_cache": g_cache,
            "ssm_state_indices": ssm_state_indices,
            "write_pos": write_pos,
        }
    )
    del _LAST_CALLS[:-_KEEP]

    batch = mixed_qkv.shape[0]
    hv, ring_len, v_dim = d_cache.shape[1:]
    h, k_dim = k_cache.shape[1], k_cache.shape[3]
    group = hv // h
    if out is None:
        out = mixed_qkv.new_zeros(batch, 1, hv, v_dim)
    qkv = mixed_qkv.float()
    q = qkv[:, : h * k_dim].view(batch, h, k_dim)
    k = qkv[:, h * k_dim : 2 * h * k_dim].view(batch, h, k_dim)
    v = qkv[:, 2 * h * k_dim :].view(batch, hv, v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    g = kda_gate(a.reshape(batch, -1), A_log, dt_bias, hv, lower_bound)
    beta = torch.sigmoid(b.float())

    for i in range(batch):
        slot = int(ssm_state_indices[i])
        if slot < 0:
            out[i].zero_()
            continue
        pos = int(write_pos[i])
        fold = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[i]))
        state = replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = k[i].repeat_interleave(group, dim=0)
        query = q[i].repeat_interleave(group, dim=0) * scale
        alpha = g[i].exp()
        state_q = torch.einsum("hvk,hk->hv", state, alpha * query)
        state_k = torch.einsum("hvk,hk->hv", state, alpha * key)
        delta = beta[i].unsqueeze(-1) * (v[i] - state_k)
        out[i, 0] = state_q + delta * (key * query).sum(-1, keepdim=True)
        if fold:
            initial_state[slot] = state * alpha.unsqueeze(1) + delta.unsqueeze(-1) * key.unsqueeze(1)
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = k[i]
            g_cache[slot, :, pos] = g[i]
    return out, initial_state


def advance_write_pos(
    cursors: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ring_len: int,
    force_flush: Optional[torch.Tensor] = None,
) -> None:
    """Moves ``cursors[slot]`` after a step: back to 0 after a fold, else one row on."""
    for i in range(slots.shape[0]):
        slot = int(slots[i])
        if slot < 0:
            continue
        pos = int(positions[i])
        folded = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[i]))
        cursors[slot] = 0 if folded else pos + 1


def build_reference_decode() -> Dict[str, torch.Tensor]:
    """Six steps on three slots (one padding row), bf16 delta/key rings, a float32 gate ring."""
    torch.manual_seed(0)
    slots, hv, h, k_dim, v_dim, ring_len = 3, 4, 2, 8, 8, 4
    initial_state = torch.zeros(slots, hv, v_dim, k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring_len, v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring_len, k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring_len, k_dim, dtype=torch.float32)
    cursors = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.linspace(-1.0, 0.5, hv)
    dt_bias = torch.full((hv * k_dim,), 0.1)
    rows = torch.tensor([2, -1, 0], dtype=torch.int32)
    outs = []
    for step in range(6):
        mixed_qkv = torch.randn(3, 2 * h * k_dim + hv * v_dim).to(torch.bfloat16)
        a = torch.randn(3, hv * k_dim).to(torch.bfloat16)
        b = torch.randn(3, hv).to(torch.bfloat16)
        pos = cursors[rows.clamp(min=0).long()]
        flush = torch.tensor([0, 0, int(step == 2)], dtype=torch.int32)
        out, _ = fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, k_dim**-0.5, initial_state, d_cache, k_cache, g_cache,
            rows, pos, force_flush=flush,
        )
        advance_write_pos(cursors, rows, pos, ring_len, flush)
        outs.append(out.clone())
    return {
        "initial_state": initial_state,
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": g_cache,
        "write_pos": cursors,
        "out": torch.stack(outs),
    }
