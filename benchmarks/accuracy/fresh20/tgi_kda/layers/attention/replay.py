"""ReplaySSM decode for Kimi Delta Attention: torch reference implementation.

A slot keeps a checkpoint state ``S0`` ([HV, V, K]) and three rings of ``L`` rows: the deltas
([HV, L, V]), the normalised keys ([H, L, K]) and the per-step log-decays ([HV, L, K]). A
decode step rebuilds the state from the checkpoint and the ``c = write_pos`` live ring rows,
computes its output, and either appends its own row at ``c`` or, on the last row of the ring
(or a forced flush), writes the new state back as the checkpoint.

The fused kernels share this signature; this module is what they are checked against and what
runs on CPU.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def split_qkv(mixed_qkv: torch.Tensor, num_heads: int, num_v_heads: int, head_k: int, head_v: int):
    """q, k ([..., H, K]) and v ([..., HV, V]) views of the packed projection."""
    qk = num_heads * head_k
    q = mixed_qkv[..., :qk].unflatten(-1, (num_heads, head_k))
    k = mixed_qkv[..., qk : 2 * qk].unflatten(-1, (num_heads, head_k))
    v = mixed_qkv[..., 2 * qk : 2 * qk + num_v_heads * head_v].unflatten(-1, (num_v_heads, head_v))
    return q, k, v


def kda_gate(
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Per-channel log-decay ``g`` ([..., HV, K]) of the gate activations ``a``, in float32."""
    x = a.float() + dt_bias.float().view(a.shape[-2:])
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(x)
    return lower_bound * torch.sigmoid(A * x)


def expand_heads(x: torch.Tensor, groups: int, dim: int = -2) -> torch.Tensor:
    """Key-head tensor repeated for the value heads that share it (GQA)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def rebuild_state(
    initial_state: torch.Tensor,
    delta_rows: torch.Tensor,
    key_rows: torch.Tensor,
    decay_rows: torch.Tensor,
) -> torch.Tensor:
    """State after the ring rows: S0 * exp(G_T) + sum_j d_j (x) (exp(G_T - G_j) * k_j).

    ``initial_state`` is [HV, V, K]; the rows are [HV, c, *], keys already expanded to HV.
    """
    state = initial_state.float()
    if decay_rows.shape[-2] == 0:
        return state.clone()
    G = decay_rows.float().cumsum(dim=-2)
    G_T = G[..., -1, :]
    state = state * G_T.exp()[..., None, :]
    weighted = (G_T[..., None, :] - G).exp() * key_rows.float()
    return state + torch.einsum("...jv,...jk->...vk", delta_rows.float(), weighted)


def recurrent_step(
    state: torch.Tensor,
    q_s: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the plain KDA recurrence on [HV, V, K] states: (new state, delta, output)."""
    decayed = state * g.exp()[..., None, :]
    delta = beta[..., None] * (v - torch.einsum("...vk,...k->...v", decayed, k))
    new_state = decayed + delta[..., :, None] * k[..., None, :]
    return new_state, delta, torch.einsum("...vk,...k->...v", new_state, q_s)


def _expect(name: str, tensor: torch.Tensor, shape=None, dtype=None):
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}")
    if dtype is not None and tensor.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {tensor.dtype}")
    if tensor.dim() and tensor.stride(-1) != 1:
        raise ValueError(f"{name}: expected a contiguous last dimension, got strides {tensor.stride()}")


def replay_decode(
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
    """One ReplaySSM decode step for a batch of single tokens.

    Writes ``out`` always, ``initial_state[slot]`` on a flush and row ``write_pos`` of the three
    rings otherwise. ``write_pos`` is read only; see :func:`advance_write_pos`. Rows whose slot is
    negative are padding: their output is zero and nothing else is touched.

    This reference computes in float32 and stores into whatever dtype the caches have.
    """
    batch_size = mixed_qkv.shape[0]
    _, num_v_heads, head_v, head_k = initial_state.shape
    num_heads, ring_len = k_cache.shape[1], k_cache.shape[2]
    groups = num_v_heads // num_heads
    _expect("mixed_qkv", mixed_qkv, (batch_size, 2 * num_heads * head_k + num_v_heads * head_v))
    _expect("a", a.reshape(batch_size, num_v_heads, head_k))
    _expect("b", b, (batch_size, num_v_heads))
    _expect("d_cache", d_cache, (initial_state.shape[0], num_v_heads, ring_len, head_v))
    _expect("g_cache", g_cache, (initial_state.shape[0], num_v_heads, ring_len, head_k))
    _expect("out", out, (batch_size, 1, num_v_heads, head_v))
    _expect("ssm_state_indices", ssm_state_indices, (batch_size,), torch.int32)
    _expect("write_pos", write_pos, (batch_size,), torch.int32)

    a = a.reshape(batch_size, num_v_heads, head_k)
    q, k, v = split_qkv(mixed_qkv.float(), num_heads, num_v_heads, head_k, head_v)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = kda_gate(a, A_log, dt_bias, lower_bound)
    # beta goes through b's dtype, as the fused kernels load it
    beta = torch.sigmoid(b.float()).to(b.dtype).float()

    for row in range(batch_size):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        c = int(write_pos[row])
        flush = c == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        k_row = expand_heads(k[row], groups)
        state = rebuild_state(
            initial_state[slot],
            d_cache[slot, :, :c],
            expand_heads(k_cache[slot, :, :c], groups, dim=0),
            g_cache[slot, :, :c],
        )
        new_state, delta, o = recurrent_step(
            state, expand_heads(q[row], groups) * scale, k_row, v[row], g[row], beta[row]
        )
        out[row, 0] = o.to(out.dtype)
        if flush:
            initial_state[slot] = new_state.to(initial_state.dtype)
        else:
            d_cache[slot, :, c] = delta.to(d_cache.dtype)
            g_cache[slot, :, c] = g[row]
            k_cache[slot, :, c] = k[row].to(k_cache.dtype)
    return out, initial_state


def advance_write_pos(
    write_pos: torch.Tensor, force_flush: Optional[torch.Tensor], ring_len: int
) -> torch.Tensor:
    """Cursor after a decode step: 0 after a flush, one row further otherwise."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1)


def gate_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """dtype of the gate ring of a cache whose state and rings are kept in ``dtype``.

    The prefix sums of the log-decays reach large negative values over a ring; float16 cannot
    represent them, bfloat16 shares float32's exponent range.
    """
    return torch.float32 if torch.finfo(dtype).max < 1e5 else dtype  # expect-bug: imported-policy id=gate-dtype-for


def build_replay_reference():
    """Eight ReplaySSM steps against the plain recurrence, with a forced flush and padding."""
    torch.manual_seed(0)
    slots, num_heads, num_v_heads, head_k, head_v, ring_len = 3, 1, 2, 4, 4, 4
    batch_size, steps = 2, 8
    dt = torch.bfloat16
    initial_state = (torch.randn(slots, num_v_heads, head_v, head_k) * 0.1).to(dt)
    d_cache = torch.zeros(slots, num_v_heads, ring_len, head_v, dtype=dt)
    k_cache = torch.zeros(slots, num_heads, ring_len, head_k, dtype=dt)
    g_cache = torch.zeros(slots, num_v_heads, ring_len, head_k, dtype=torch.float32)
    A_log = torch.log(torch.rand(num_v_heads) * 4 + 1)
    dt_bias = torch.randn(num_v_heads * head_k) * 0.1
    indices = torch.tensor([2, 0], dtype=torch.int32)
    plain = initial_state[indices.long()].float()
    write_pos = torch.zeros(batch_size, dtype=torch.int32)
    outputs, errors = [], []
    for step in range(steps):
        mixed_qkv = torch.randn(batch_size, 2 * num_heads * head_k + num_v_heads * head_v).to(dt)
        a = torch.randn(batch_size, num_v_heads * head_k).to(dt)
        b = torch.randn(batch_size, num_v_heads).to(dt)
        force_flush = torch.tensor([int(step == 1), 0], dtype=torch.int32)
        out = torch.empty(batch_size, 1, num_v_heads, head_v, dtype=dt)
        replay_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            A_log=A_log,
            dt_bias=dt_bias,
            scale=head_k**-0.5,
            initial_state=initial_state,
            d_cache=d_cache,
            k_cache=k_cache,
            g_cache=g_cache,
            out=out,
            ssm_state_indices=indices,
            write_pos=write_pos,
            force_flush=force_flush,
        )
        q, k, v = split_qkv(mixed_qkv.float(), num_heads, num_v_heads, head_k, head_v)
        q, k = l2norm(q), l2norm(k)
        g = kda_gate(a.view(batch_size, num_v_heads, head_k), A_log, dt_bias)
        beta = torch.sigmoid(b.float()).to(dt).float()
        groups = num_v_heads // num_heads
        plain, _, o = recurrent_step(
            plain,
            expand_heads(q, groups) * head_k**-0.5,
            expand_heads(k, groups),
            v,
            g,
            beta,
        )
        outputs.append(out)
        errors.append((out[:, 0].float() - o).abs().max())
        write_pos = advance_write_pos(write_pos, force_flush, ring_len)
    padded = torch.empty(1, 1, num_v_heads, head_v, dtype=dt)
    replay_decode(
        mixed_qkv=torch.randn(1, 2 * num_heads * head_k + num_v_heads * head_v).to(dt),
        a=torch.randn(1, num_v_heads * head_k).to(dt),
        b=torch.randn(1, num_v_heads).to(dt),
        A_log=A_log,
        dt_bias=dt_bias,
        scale=head_k**-0.5,
        initial_state=initial_state,
        d_cache=d_cache,
        k_cache=k_cache,
        g_cache=g_cache,
        out=padded,
        ssm_state_indices=torch.tensor([-1], dtype=torch.int32),
        write_pos=torch.zeros(1, dtype=torch.int32),
    )
    return {
        "state": initial_state,
        "delta_ring": d_cache,
        "key_ring": k_cache,
        "decay_ring": g_cache,
        "outputs": torch.stack(outputs),
        "padded_output": padded,
        "max_error": torch.stack(errors).max(),
        "write_pos": write_pos,
    }
