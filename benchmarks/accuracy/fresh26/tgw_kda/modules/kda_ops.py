"""ReplaySSM decode for Kimi Delta Attention: the CPU path and the helpers around the kernel.

The web UI uses the fused CUDA kernel when it is installed; CPU-only installs use this module's
implementation, which has the kernel's argument order and in-place contract: ``out`` is always
written, the checkpoint ``initial_state`` only when a row's ring is folded back into it (a flush),
and otherwise one row of the delta, key and log-decay rings. ``write_pos`` is read-only; callers
move their cursors with :func:`advance_write_pos` afterwards.

The CPU path reads every ring through ``.float()``, so it also runs on rings of other floating
dtypes. The last calls are kept (arguments only, by reference) for the Session tab's "last
decode step" panel.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

MAX_LOGGED_CALLS = 8
_decode_log: List[Dict[str, Any]] = []


def last_decode_call() -> Optional[Dict[str, Any]]:
    """The arguments of the most recent decode step, or None."""
    return _decode_log[-1] if _decode_log else None


def clear_decode_log() -> None:
    _decode_log.clear()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    num_v_heads: int,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Per-channel log-decays ``[..., HV, K]`` in float32 from the gate inputs ``a [..., HV*K]``.

    Unbounded: ``g = -exp(A_log) * softplus(a + dt_bias)``; with a (negative) ``lower_bound``:
    ``g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``.
    """
    x = a.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().reshape(num_v_heads, -1)
    rate = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def replay_state(
    checkpoint: torch.Tensor,
    delta_rows: torch.Tensor,
    key_rows: torch.Tensor,
    log_decay_rows: torch.Tensor,
    count: int,
    group: int,
) -> torch.Tensor:
    """The state ``[HV, V, K]`` after replaying the first ``count`` ring rows onto ``checkpoint``.

    Row ``j`` contributes ``d_j k_j^T`` decayed by every later row: ``exp(G_total - G_j)`` with
    ``G_j`` the inclusive prefix sum of the log-decays.
    """
    state = checkpoint.float()
    if count == 0:
        return state.clone()
    prefix = log_decay_rows[:, :count].float().cumsum(dim=1)
    total = prefix[:, -1]
    keys = key_rows[:, :count].float().repeat_interleave(group, dim=0)
    weighted = keys * torch.exp(total.unsqueeze(1) - prefix)
    replayed = torch.einsum("hjv,hjk->hvk", delta_rows[:, :count].float(), weighted)
    return state * total.exp().unsqueeze(1) + replayed


def _check(name: str, tensor: torch.Tensor, dims: int) -> None:
    if tensor.dim() != dims:
        raise ValueError(f"{name}: expected a {dims}-d tensor, got shape {tuple(tensor.shape)}")


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
    """One decode step of ``B`` rows, each on cache slot ``ssm_state_indices[b]``.

    Args:
        mixed_qkv: ``[B, 2*H*K + HV*V]`` packed queries, keys and values.
        a: ``[B, HV*K]`` or ``[B, HV, K]`` gate inputs.
        b: ``[B, HV]`` write-strength logits.
        A_log: ``[HV]`` log decay rates. dt_bias: ``[HV*K]`` or ``[HV, K]`` gate bias.
        scale: query scale (usually ``K ** -0.5``).
        initial_state: checkpoints ``[slots, HV, V, K]``.
        d_cache: delta rings ``[slots, HV, L, V]``. k_cache: key rings ``[slots, H, L, K]``.
        g_cache: log-decay rings ``[slots, HV, L, K]``, float32.
        ssm_state_indices: ``[B]`` int32 slots; negative rows are padding.
        write_pos: ``[B]`` int32 ring cursor of each row.
        out: ``[B, 1, HV, V]`` output buffer. force_flush: ``[B]`` int32, fold after this token.

    Returns:
        ``(out, initial_state)``.
    """
    _check("initial_state", initial_state, 4)
    _check("d_cache", d_cache, 4)
    _check("k_cache", k_cache, 4)
    _check("g_cache", g_cache, 4)
    _decode_log.append(
        {
            "initial_state": initial_state,
            "d_cache": d_cache,
            "k_cache": k_cache,
            "g_cache": g_cache,
            "ssm_state_indices": ssm_state_indices,
            "write_pos": write_pos,
        }
    )
    del _decode_log[:-MAX_LOGGED_CALLS]

    rows = mixed_qkv.shape[0]
    num_v_heads, ring_len, v_dim = d_cache.shape[1:]
    num_heads, k_dim = k_cache.shape[1], k_cache.shape[-1]
    group = num_v_heads // num_heads
    if out is None:
        out = mixed_qkv.new_zeros(rows, 1, num_v_heads, v_dim)

    packed = mixed_qkv.float()
    q = packed[:, : num_heads * k_dim].reshape(rows, num_heads, k_dim)
    k = packed[:, num_heads * k_dim : 2 * num_heads * k_dim].reshape(rows, num_heads, k_dim)
    v = packed[:, 2 * num_heads * k_dim :].reshape(rows, num_v_heads, v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = kda_gate(a.reshape(rows, -1), A_log, dt_bias, num_v_heads, lower_bound)
    beta = torch.sigmoid(b).float()

    for row in range(rows):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        state = replay_state(
            initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], cursor, group
        )
        key = k[row].repeat_interleave(group, dim=0)
        query = q[row].repeat_interleave(group, dim=0) * scale
        alpha = g[row].exp()
        state_q = torch.einsum("hvk,hk->hv", state, alpha * query)
        state_k = torch.einsum("hvk,hk->hv", state, alpha * key)
        delta = beta[row].unsqueeze(-1) * (v[row] - state_k)
        out[row, 0] = state_q + delta * (key * query).sum(-1, keepdim=True)
        if flush:
            new_state = state * alpha.unsqueeze(1) + delta.unsqueeze(-1) * key.unsqueeze(1)
            initial_state[slot] = new_state
        else:
            d_cache[slot, :, cursor] = delta
            g_cache[slot, :, cursor] = g[row]
            k_cache[slot, :, cursor] = k[row]
    return out, initial_state


def advance_write_pos(
    cursors: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ring_len: int,
    force_flush: Optional[torch.Tensor] = None,
) -> None:
    """Moves the per-slot cursor table after a decode step: 0 after a flush, else one row on."""
    for row in range(slots.shape[0]):
        slot = int(slots[row])
        if slot < 0:
            continue
        pos = int(positions[row])
        flushed = pos == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        cursors[slot] = 0 if flushed else pos + 1


def build_reference_decode() -> Dict[str, Any]:
    """Five decode steps on a two-slot cache with bf16 delta/key rings and a float32 gate ring."""
    torch.manual_seed(0)
    slots, hv, h, k_dim, v_dim, ring = 2, 4, 2, 8, 8, 4
    state = torch.zeros(slots, hv, v_dim, k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring, v_dim, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring, k_dim, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring, k_dim)
    cursors = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.linspace(0.0, 1.0, hv)
    dt_bias = torch.zeros(hv * k_dim)
    index = torch.tensor([1, 0], dtype=torch.int32)
    outputs = []
    for step in range(5):
        mixed_qkv = torch.randn(2, 2 * h * k_dim + hv * v_dim, dtype=torch.bfloat16)
        a = torch.randn(2, hv * k_dim, dtype=torch.bfloat16)
        b = torch.randn(2, hv, dtype=torch.bfloat16)
        pos = cursors[index.long()]
        flush = torch.tensor([int(step == 1), 0], dtype=torch.int32)
        out, _ = fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, k_dim**-0.5, state, d_cache, k_cache, g_cache,
            index, pos, force_flush=flush,
        )
        advance_write_pos(cursors, index, pos, ring, flush)
        outputs.append(out.clone())
    return {
        "state": state,
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": g_cache,
        "write_pos": cursors,
        "out": torch.stack(outputs),
    }
