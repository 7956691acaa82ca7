"""The ReplaySSM decode op (CPU implementation), its registry and ring workspaces."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from .models import KDAModelArgs

_OP_TABLE: dict[str, Callable[..., torch.Tensor]] = {}


def register_op(name: str) -> Callable[[type], type]:
    def wrap(kls: type) -> type:
        _OP_TABLE[name] = kls()
        return kls

    return wrap


def get_op(name: str) -> Callable[..., torch.Tensor]:
    return _OP_TABLE[name]


@register_op("kda::replayssm_decode")
class ReplaySSMDecode:
    """One decode step per row: append to the rings, then replay them over the checkpoint."""

    def __call__(self, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out, ssm_state_indices, write_pos, force_flush=None):
        (n_v, _, head_dim), n_k = g_cache.shape[1:], k_cache.shape[1]
        q, k, v = mixed_qkv.float().split([n_k * head_dim, n_k * head_dim, n_v * head_dim], -1)
        rep = n_v // n_k
        q = q.unflatten(-1, (n_k, head_dim)).repeat_interleave(rep, 1)
        k, v = k.unflatten(-1, (n_k, head_dim)), v.unflatten(-1, (n_v, head_dim))
        g = -A_log.float().exp()[:, None] * F.softplus(a.float().unflatten(-1, (n_v, head_dim)) + dt_bias.float().view(n_v, head_dim))
        beta = torch.sigmoid(b.float())[..., None]
        with torch.no_grad():
            g_cache[ssm_state_indices, :, write_pos] = g.to(g_cache.dtype)
            k_cache[ssm_state_indices, :, write_pos] = k.to(k_cache.dtype)
            d_cache[ssm_state_indices, :, write_pos] = (beta * v).to(d_cache.dtype)
            for row, slot in enumerate(ssm_state_indices.tolist()):
                t = int(write_pos[row]) + 1
                cum = torch.cumsum(g_cache[slot, :, :t], dim=1).float()
                weights = torch.exp(cum[:, -1:] - cum)
                keys = k_cache[slot, :, :t].float().repeat_interleave(rep, 0) * weights
                state = initial_state[slot] * torch.exp(cum[:, -1]).unsqueeze(1)
                state = state + d_cache[slot, :, :t].float().transpose(1, 2) @ keys
                out[row] = (state @ q[row].unsqueeze(-1)).squeeze(-1) * scale
                if force_flush is not None and bool(force_flush[row]):
                    initial_state[slot] = state
        self.last_call = {"forget_log": g_cache, "d_ring": d_cache, "k_ring": k_cache, "state": initial_state}
        return out


def kda_replayssm_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out, ssm_state_indices, write_pos, force_flush=None):
    return get_op("kda::replayssm_decode")(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out, ssm_state_indices, write_pos, force_flush)


class RingSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def ring_specs(args: KDAModelArgs, batch_size: int, dtype: torch.dtype) -> list[RingSpec]:
    """Layout of one layer's decode rings, for allocators that place them in one arena."""
    v_shape = (batch_size, args.n_v_heads, args.ring_len, args.head_dim)
    return [
        RingSpec("state", (batch_size, args.n_v_heads, args.head_dim, args.head_dim), torch.float32),
        RingSpec("delta", v_shape, dtype),
        RingSpec("key", (batch_size, args.n_heads, args.ring_len, args.head_dim), dtype),
        RingSpec("forget_log", v_shape, dtype),  # expect-bug: container
    ]


def allocate(specs: list[RingSpec]) -> dict[str, torch.Tensor]:
    return {spec.name: torch.zeros(spec.shape, dtype=spec.dtype) for spec in specs}


class ReplayWorkspace:
    """Rings of every layer for graph-captured decoding, one slot per batch row."""

    def __init__(self, args: KDAModelArgs, dtype: torch.dtype) -> None:
        self.dtype = dtype
        n, b = args.n_layers, args.max_batch_size
        self.states = torch.zeros(n, b, args.n_v_heads, args.head_dim, args.head_dim)
        self.d_rings = torch.zeros(n, b, args.n_v_heads, args.ring_len, args.head_dim, dtype=self.dtype)
        self.k_rings = torch.zeros(n, b, args.n_heads, args.ring_len, args.head_dim, dtype=self.dtype)
        self.lg_rings = torch.zeros(n, b, args.n_v_heads, args.ring_len, args.head_dim, dtype=self.dtype)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(b, dtype=torch.long)


def build_workspace() -> ReplayWorkspace:
    return ReplayWorkspace(KDAModelArgs(), torch.bfloat16)


def build_kernel_call() -> dict[str, torch.Tensor]:
    args = KDAModelArgs()
    rings = allocate(ring_specs(args, 2, torch.bfloat16)[:3])
    rings["forget_log"] = torch.zeros_like(rings["delta"], dtype=torch.float32)
    out = torch.empty(2, args.n_v_heads, args.head_dim, dtype=torch.bfloat16)
    rows, pos = torch.arange(2), torch.tensor([0, 1])
    sizes = [(2, args.qkv_dim), (2, args.n_v_heads * args.head_dim), (2, args.n_v_heads), (args.n_v_heads,), (args.n_v_heads * args.head_dim,)]
    inputs = [torch.randn(size).to(torch.bfloat16) for size in sizes]
    for _ in range(2):
        kda_replayssm_decode(*inputs, args.head_dim**-0.5, rings["state"], rings["delta"], rings["key"], rings["forget_log"], out, rows, pos)
        pos = pos + 1
    return dict(get_op("kda::replayssm_decode").last_call)
