"""The ReplaySSM decode step of Kimi Delta Attention, CPU path.

ReplaySSM keeps, per cache slot, a checkpoint of the recurrent state and three short rings of the
tokens decoded since that checkpoint: the deltas ``d``, the keys ``k`` and the per-channel
log-decays ``g``. A step replays the rings onto the checkpoint (prefix sums of ``g``,
exponentiated), applies the new token and either appends its row to the rings or, when the ring
is full or a flush is forced, folds everything back into the checkpoint.

The d/k rings may be stored in the model dtype; the log-decay ring is summed and exponentiated
and is kept in float32. This implementation upcasts whatever it is given, so it also runs on
rings of other dtypes; the fused kernel does not check either.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

_CALLS: List[Dict[str, Any]] = []
_KEEP_CALLS = 4


def last_decode_call() -> Optional[Dict[str, Any]]:
    """The tensors the most recent decode step was called with (by reference), or None."""
    return _CALLS[-1] if _CALLS else None


def reset_decode_calls() -> None:
    del _CALLS[:]


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    num_v_heads: int,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Float32 log-decays ``[..., HV, K]`` from the gate projection ``a [..., HV*K]``."""
    x = a.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().view(num_v_heads, -1)
    rate = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def _replay(
    checkpoint: torch.Tensor, d_rows: torch.Tensor, k_rows: torch.Tensor, g_rows: torch.Tensor, n: int, group: int
) -> torch.Tensor:
    """State ``[HV, V, K]`` after the first ``n`` ring rows."""
    state = checkpoint.float()
    if n == 0:
        return state.clone()
    prefix = torch.cumsum(g_rows[:, :n].float(), dim=1)
    last = prefix[:, -1]
    keys = k_rows[:, :n].float().repeat_interleave(group, dim=0) * torch.exp(last.unsqueeze(1) - prefix)
    return state * last.exp().unsqueeze(1) + torch.einsum("hnv,hnk->hvk", d_rows[:, :n].float(), keys)


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
    """One decode token for each of ``B`` rows.

    ``initial_state [slots, HV, V, K]``, ``d_cache [slots, HV, L, V]``, ``k_cache [slots, H, L, K]``
    and ``g_cache [slots, HV, L, K]`` (float32 log-decays) are updated in place; row ``i`` uses
    slot ``ssm_state_indices[i]`` (int32, negative = padding) at ring position ``write_pos[i]``.
    Returns ``(out [B, 1, HV, V], initial_state)``.
    """
    for name, tensor in (("initial_state", initial_state), ("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be 4-d, got {tuple(tensor.shape)}")
    _CALLS.append(
        {
            "initial_state": initial_state,
            "d_cache": d_cache,
            "k_cache": k_cache,
            "g_cache": g_cache,
            "ssm_state_indices": ssm_state_indices,
            "write_pos": write_pos,
        }
    )
    del _CALLS[:-_KEEP_CALLS]

    rows = mixed_qkv.shape[0]
    hv, ring_len, v_dim = d_cache.shape[1], d_cache.shape[2], d_cache.shape[3]
    h, k_dim = k_cache.shape[1], k_cache.shape[3]
    group = hv // h
    if out is None:
        out = torch.empty(rows, 1, hv, v_dim, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    qkv = mixed_qkv.float()
    q = qkv[:, : h * k_dim].view(rows, h, k_dim)
    k = qkv[:, h * k_dim : 2 * h * k_dim].view(rows, h, k_dim)
    v = qkv[:, 2 * h * k_dim :].view(rows, hv, v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    g = kda_gate(a.reshape(rows, -1), A_log, dt_bias, hv, lower_bound)
    beta = torch.sigmoid(b.float())

    for i in range(rows):
        slot = int(ssm_state_indices[i])
        if slot < 0:
            out[i].zero_()
            continue
        pos = int(write_pos[i])
        flush = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[i]))
        state = _replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        ki = k[i].repeat_interleave(group, dim=0)
        qi = q[i].repeat_interleave(group, dim=0) * scale
        decay = g[i].exp()
        delta = beta[i].unsqueeze(-1) * (v[i] - torch.einsum("hvk,hk->hv", state, decay * ki))
        out[i, 0] = torch.einsum("hvk,hk->hv", state, decay * qi) + delta * (ki * qi).sum(-1, keepdim=True)
        if flush:
            initial_state[slot] = state * decay.unsqueeze(1) + delta.unsqueeze(-1) * ki.unsqueeze(1)
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = k[i]
            g_cache[slot, :, pos] = g[i]
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ring_len: int,
    force_flush: Optional[torch.Tensor] = None,
) -> None:
    """Moves the per-slot cursors ``write_pos [slots]`` after a step (0 after a flush)."""
    for i in range(slots.shape[0]):
        slot = int(slots[i])
        if slot < 0:
            continue
        pos = int(positions[i])
        flushed = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[i]))
        write_pos[slot] = 0 if flushed else pos + 1


def build_reference_decode() -> Dict[str, Any]:
    """Six steps on two slots: bf16 delta/key rings, a float32 log-decay ring."""
    torch.manual_seed(0)
    slots, hv, h, k_dim, v_dim, ring_len = 2, 4, 2, 8, 8, 4
    initial_state = torch.zeros(slots, hv, v_dim, k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring_len, v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring_len, k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring_len, k_dim, dtype=torch.float32)
    write_pos = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.linspace(-0.5, 0.5, hv)
    dt_bias = torch.zeros(hv * k_dim)
    index = torch.tensor([0, 1], dtype=torch.int32)
    outs = []
    for step in range(6):
        mixed_qkv = torch.randn(2, 2 * h * k_dim + hv * v_dim).to(torch.bfloat16)
        a = torch.randn(2, hv * k_dim).to(torch.bfloat16)
        b = torch.randn(2, hv).to(torch.bfloat16)
        positions = write_pos[index.long()]
        flush = torch.tensor([0, int(step == 2)], dtype=torch.int32)
        out, _ = fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, k_dim**-0.5, initial_state, d_cache, k_cache, g_cache,
            index, positions, force_flush=flush,
        )
        advance_write_pos(write_pos, index, positions, ring_len, flush)
        outs.append(out.float())
    return {
        "initial_state": initial_state,
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": g_cache,
        "write_pos": write_pos,
        "out": torch.stack(outs),
    }
