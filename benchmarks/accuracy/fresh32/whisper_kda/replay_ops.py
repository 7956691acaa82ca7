"""ReplaySSM decode for the Kimi Delta Attention layers of the text decoder.

The CUDA build ships a fused kernel; this module is the reference implementation that CPU installs
and the tests use. It has the kernel's signature and in-place contract:

* ``out`` is always written;
* a row whose ring is full (or that is asked to, through ``force_flush``) folds its ring and the
  current token into its checkpoint ``initial_state[slot]``;
* any other row appends one row to its delta, key and log-decay rings at ``write_pos[row]``.

``write_pos`` is only read; callers move their cursor tables with :func:`advance_write_pos`.
Every ring is read through ``.float()``, so the reference path also accepts rings of other
floating dtypes, but the log-decay ring is specified as float32: the kernel takes prefix sums of
it and exponentiates them.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

_RECENT_CALLS: List[Dict[str, Any]] = []
_MAX_RECENT_CALLS = 4


def recent_calls() -> List[Dict[str, Any]]:
    """The tensor arguments of the last few decode calls (by reference), oldest first."""
    return list(_RECENT_CALLS)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def kda_gate(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: Optional[torch.Tensor],
    num_heads: int,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Log forget gates ``[..., HV, K]`` (float32) from gate inputs ``a [..., HV*K]``.

    ``A_log`` holds one log rate per value head. Without a bound the gate is
    ``-exp(A_log) * softplus(a + dt_bias)``; with a negative ``lower_bound`` it is
    ``lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``.
    """
    x = a.float().unflatten(-1, (num_heads, -1))
    if dt_bias is not None:
        x = x + dt_bias.float().reshape(num_heads, -1)
    rate = A_log.float().exp().reshape(num_heads, 1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def replay(
    checkpoint: torch.Tensor,
    d_rows: torch.Tensor,
    k_rows: torch.Tensor,
    g_rows: torch.Tensor,
    count: int,
    group: int,
) -> torch.Tensor:
    """The state ``[HV, V, K]`` after the first ``count`` ring rows are replayed onto ``checkpoint``."""
    state = checkpoint.float()
    if count == 0:
        return state.clone()
    cum = g_rows[:, :count].float().cumsum(dim=1)
    last = cum[:, -1]
    keys = k_rows[:, :count].float().repeat_interleave(group, dim=0)
    decayed = keys * torch.exp(last.unsqueeze(1) - cum)
    return state * last.exp().unsqueeze(1) + torch.einsum("hjv,hjk->hvk", d_rows[:, :count].float(), decayed)


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: Optional[torch.Tensor],
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
    """One decode step for ``B`` rows; row ``b`` works on cache slot ``ssm_state_indices[b]``.

    Shapes: ``mixed_qkv [B, 2*H*K + HV*V]`` (queries, keys, values), ``a [B, HV*K]``,
    ``b [B, HV]``, ``A_log [HV]``, ``dt_bias [HV*K]`` or None; ``initial_state [slots, HV, V, K]``
    (float32), ``d_cache [slots, HV, L, V]``, ``k_cache [slots, H, L, K]``,
    ``g_cache [slots, HV, L, K]`` (float32), ``ssm_state_indices [B]`` and ``write_pos [B]``
    (int32; a negative slot marks a padding row), ``out [B, 1, HV, V]``.

    Returns ``(out, initial_state)``.
    """
    for name, tensor in (("initial_state", initial_state), ("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be 4-d, got {tuple(tensor.shape)}")
    _RECENT_CALLS.append(
        {
            "initial_state": initial_state,
            "d_cache": d_cache,
            "k_cache": k_cache,
            "g_cache": g_cache,
            "ssm_state_indices": ssm_state_indices,
            "write_pos": write_pos,
        }
    )
    del _RECENT_CALLS[:-_MAX_RECENT_CALLS]

    n_rows = mixed_qkv.shape[0]
    n_head, ring_len, v_dim = d_cache.shape[1:]
    n_key_head, k_dim = k_cache.shape[1], k_cache.shape[3]
    group = n_head // n_key_head
    if out is None:
        out = mixed_qkv.new_zeros(n_rows, 1, n_head, v_dim)

    qkv = mixed_qkv.float()
    q = qkv[:, : n_key_head * k_dim].reshape(n_rows, n_key_head, k_dim)
    k = qkv[:, n_key_head * k_dim : 2 * n_key_head * k_dim].reshape(n_rows, n_key_head, k_dim)
    v = qkv[:, 2 * n_key_head * k_dim :].reshape(n_rows, n_head, v_dim)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = kda_gate(a.reshape(n_rows, -1), A_log, dt_bias, n_head, lower_bound)
    beta = b.float().sigmoid()

    for row in range(n_rows):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        pos = int(write_pos[row])
        flush = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[row]))
        state = replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = k[row].repeat_interleave(group, dim=0)
        query = q[row].repeat_interleave(group, dim=0) * scale
        alpha = g[row].exp()
        s_q = torch.einsum("hvk,hk->hv", state, alpha * query)
        s_k = torch.einsum("hvk,hk->hv", state, alpha * key)
        delta = beta[row].unsqueeze(-1) * (v[row] - s_k)
        out[row, 0] = s_q + delta * (key * query).sum(-1, keepdim=True)
        if flush:
            initial_state[slot] = state * alpha.unsqueeze(1) + delta.unsqueeze(-1) * key.unsqueeze(1)
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = k[row]
            g_cache[slot, :, pos] = g[row]
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ring_len: int,
    force_flush: Optional[torch.Tensor] = None,
) -> None:
    """Moves a cursor table after a decode step: back to 0 after a flush, one row on otherwise."""
    for row in range(slots.shape[0]):
        slot = int(slots[row])
        if slot < 0:
            continue
        pos = int(positions[row])
        flushed = pos == ring_len - 1 or (force_flush is not None and bool(force_flush[row]))
        write_pos[slot] = 0 if flushed else pos + 1


def build_reference_decode() -> Dict[str, torch.Tensor]:
    """Six steps on three slots (one row padded): fp16 delta/key rings, float32 log-decay ring."""
    torch.manual_seed(0)
    slots, n_head, n_key_head, k_dim, v_dim, ring_len = 3, 2, 2, 4, 4, 4
    initial_state = torch.zeros(slots, n_head, v_dim, k_dim, dtype=torch.float32)
    d_cache = torch.zeros(slots, n_head, ring_len, v_dim, dtype=torch.float16)
    k_cache = torch.zeros(slots, n_key_head, ring_len, k_dim, dtype=torch.float16)
    g_cache = torch.zeros(slots, n_head, ring_len, k_dim, dtype=torch.float32)
    cursors = torch.zeros(slots, dtype=torch.int32)
    rows = torch.tensor([2, -1, 0], dtype=torch.int32)
    A_log = torch.tensor([0.0, 0.5])
    outs = []
    for _ in range(6):
        mixed_qkv = torch.randn(3, 2 * n_key_head * k_dim + n_head * v_dim, dtype=torch.float16)
        a = torch.randn(3, n_head * k_dim, dtype=torch.float16)
        b = torch.randn(3, n_head, dtype=torch.float16)
        pos = cursors[rows.clamp(min=0).long()]
        out, _ = fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, None, k_dim**-0.5, initial_state, d_cache, k_cache, g_cache, rows, pos
        )
        advance_write_pos(cursors, rows, pos, ring_len)
        outs.append(out.clone())
    return {
        "initial_state": initial_state,
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": g_cache,
        "write_pos": cursors,
        "out": torch.stack(outs),
    }
