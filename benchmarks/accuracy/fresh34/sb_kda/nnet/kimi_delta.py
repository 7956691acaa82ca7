"""Kimi Delta Attention (KDA) with ReplaySSM caches.

* ``KDARingCache``: per-slot buffers an encoder owns (batch decoding; saved with the model);
* ``KDALayerStreamingContext``: a dataclass passed from chunk to chunk by streaming contexts.

Both give ``decode_kwargs()``, the cache arguments of ``kda_ops.replayssm_kda_decode``.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from sb_kda.nnet import kda_ops
from sb_kda.utils import data_utils


@dataclass
class StreamingPrecision:
    """Storage dtypes of a streaming context: delta/key rings, and the log-forget ring."""

    ring_dtype: torch.dtype = torch.float32
    forget_dtype: torch.dtype = torch.float32


def ring_shapes(num_slots, num_heads, num_v_heads, head_dim, v_head_dim, ring_len) -> Dict[str, Tuple[int, ...]]:
    return {
        "memory": (num_slots, num_v_heads, v_head_dim, head_dim),
        "delta_ring": (num_slots, num_v_heads, ring_len, v_head_dim),
        "key_ring": (num_slots, num_heads, ring_len, head_dim),
        "forget_ring": (num_slots, num_v_heads, ring_len, head_dim),
    }


@dataclass
class KDALayerStreamingContext:
    """Streaming state of one KDA layer; rows are slots."""

    memory: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    forget_ring: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def allocate(cls, shapes, precision: StreamingPrecision) -> "KDALayerStreamingContext":
        return cls(
            memory=torch.zeros(shapes["memory"], dtype=torch.float32),
            delta_ring=torch.zeros(shapes["delta_ring"], dtype=precision.ring_dtype),
            key_ring=torch.zeros(shapes["key_ring"], dtype=precision.ring_dtype),
            forget_ring=torch.zeros(shapes["forget_ring"], dtype=precision.forget_dtype),
            write_pos=torch.zeros(shapes["memory"][0], dtype=torch.int32),
        )

    def decode_kwargs(self) -> Dict[str, torch.Tensor]:
        return {"state": self.memory, "d_cache": self.delta_ring, "k_cache": self.key_ring,
                "g_cache": self.forget_ring, "write_pos": self.write_pos}


class KDARingCache(nn.Module):
    """Per-slot ReplaySSM buffers of one KDA layer; ``dtype`` is the storage of the delta/key rings."""

    def __init__(self, num_slots, num_heads, num_v_heads, head_dim, v_head_dim, ring_len, dtype=None):
        super().__init__()
        shapes = ring_shapes(num_slots, num_heads, num_v_heads, head_dim, v_head_dim, ring_len)
        self.register_buffer("memory", torch.zeros(shapes["memory"], dtype=torch.float32))
        self.register_buffer("delta_ring", torch.zeros(shapes["delta_ring"], dtype=dtype))
        self.register_buffer("key_ring", torch.zeros(shapes["key_ring"], dtype=dtype))
        self.register_buffer("log_forget", torch.zeros(shapes["forget_ring"]))  # expect-bug: default-dtype id=init-dtype
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32))

    def decode_kwargs(self) -> Dict[str, torch.Tensor]:
        return {"state": self.memory, "d_cache": self.delta_ring, "k_cache": self.key_ring,
                "g_cache": self.log_forget, "write_pos": self.write_pos}

    def reset(self) -> None:
        for buf in self.buffers():
            buf.zero_()

    def resize(self, num_slots: int) -> None:
        """Changes the number of slots; kept slots keep their contents."""
        for name, buf in list(self._buffers.items()):
            resized = torch.zeros((num_slots, *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
            keep = min(num_slots, buf.shape[0])
            resized[:keep] = buf[:keep]
            self._buffers[name] = resized


class StreamingRingCache(KDARingCache):
    """A ``KDARingCache`` whose ``log_forget`` buffer keeps float32 when the model is cast."""

    def _apply(self, fn, recurse=True):
        forget = self._buffers["log_forget"]
        super()._apply(fn, recurse)
        moved = self._buffers["log_forget"]
        if moved.dtype != forget.dtype:
            self._buffers["log_forget"] = forget.to(moved.device)
        return self


class KimiDeltaAttention(nn.Module):
    """Gated delta rule with per-channel forget gates.

    ``lower_bound`` (negative) bounds the log-forget gate as ``lower_bound * sigmoid(.)``;
    None gives the unbounded ``-exp(A_log) * softplus(.)``.
    """

    def __init__(self, d_model, num_heads=2, num_v_heads=4, head_dim=8, v_head_dim=8, ring_len=4, lower_bound=None):
        super().__init__()
        self.num_heads, self.num_v_heads = num_heads, num_v_heads
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.ring_len, self.lower_bound = ring_len, lower_bound
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_v_heads * v_head_dim, bias=False)
        self.a_proj = nn.Linear(d_model, num_v_heads * head_dim, bias=False)
        self.b_proj = nn.Linear(d_model, num_v_heads, bias=False)
        self.o_proj = nn.Linear(num_v_heads * v_head_dim, d_model, bias=False)
        self.A_log = nn.Parameter(torch.linspace(-1.0, 1.0, num_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(num_v_heads * head_dim))

    @property
    def dims(self) -> Dict[str, int]:
        return {"num_heads": self.num_heads, "num_v_heads": self.num_v_heads, "head_dim": self.head_dim,
                "v_head_dim": self.v_head_dim, "ring_len": self.ring_len}

    def project(self, x):
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_v_heads, self.v_head_dim))
        return q, k, v, self.a_proj(x), self.b_proj(x)

    def gate(self, a: torch.Tensor) -> torch.Tensor:
        """Log-forget gates ``[..., HV, K]`` of the gate inputs ``a [..., HV * K]``."""
        if self.lower_bound is None:
            return kda_ops.kda_gate(a, self.A_log, self.dt_bias, self.num_v_heads)
        x = a.unflatten(-1, (self.num_v_heads, -1)) + self.dt_bias.view(self.num_v_heads, -1)
        return self.lower_bound * torch.sigmoid(self.A_log.exp().unsqueeze(-1) * x)  # expect-bug: promotion id=bounded-prefill

    def new_context(self, batch_size: int, dtype: Optional[torch.dtype] = None) -> KDALayerStreamingContext:
        shapes = ring_shapes(batch_size, **self.dims)
        return KDALayerStreamingContext(
            memory=torch.zeros(shapes["memory"], dtype=torch.float32),
            delta_ring=torch.zeros(shapes["delta_ring"], dtype=dtype),
            key_ring=torch.zeros(shapes["key_ring"], dtype=dtype),
            forget_ring=torch.zeros(shapes["forget_ring"]),  # expect-bug: default-dtype id=valid-context
            write_pos=torch.zeros(batch_size, dtype=torch.int32),
        )

    def step(self, x: torch.Tensor, slot_idx: torch.Tensor, rings: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One token per row, ``x [B, d_model]``; ``rings`` as given by ``decode_kwargs()``."""
        q, k, v, a, b = self.project(x)
        out = kda_ops.replayssm_kda_decode(q, k, v, a, b, slot_idx=slot_idx, A_log=self.A_log,
                                           dt_bias=self.dt_bias, lower_bound=self.lower_bound, **rings)
        return self.o_proj(out.flatten(1).to(x.dtype))

    def prefill(self, x: torch.Tensor, ctx: KDALayerStreamingContext) -> torch.Tensor:
        """Runs a prompt ``x [B, T, d_model]`` (``T < ring_len``) into a fresh context at once."""
        q, k, v, a, b = self.project(x)
        group = self.num_v_heads // self.num_heads
        g = self.gate(a)
        beta = torch.sigmoid(b.float())
        keys = kda_ops.l2norm(k.float())
        queries = kda_ops.l2norm(q.float()).repeat_interleave(group, 2) * self.head_dim**-0.5
        state = ctx.memory.float()
        deltas, outs = [], []
        for t in range(x.shape[1]):
            key = keys[:, t].repeat_interleave(group, 1)
            state = state * g[:, t].float().exp().unsqueeze(2)
            delta = beta[:, t].unsqueeze(-1) * (v[:, t].float() - torch.einsum("bhvk,bhk->bhv", state, key))
            state = state + delta.unsqueeze(-1) * key.unsqueeze(2)
            deltas.append(delta)
            outs.append(torch.einsum("bhvk,bhk->bhv", state, queries[:, t]))
        ctx.delta_ring = data_utils.pad_right_to(torch.stack(deltas, 2).to(ctx.delta_ring.dtype), ctx.delta_ring.shape)[0]
        ctx.key_ring = data_utils.pad_right_to(keys.transpose(1, 2).to(ctx.key_ring.dtype), ctx.key_ring.shape)[0]
        ctx.forget_ring = data_utils.pad_right_to(g.transpose(1, 2), ctx.forget_ring.shape)[0]  # expect-bug: promotion id=bounded-prefill
        ctx.write_pos.fill_(x.shape[1])
        return self.o_proj(torch.stack(outs, 1).flatten(2).to(x.dtype))


def _tokens(batch: int, steps: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(batch, steps, 16, generator=torch.Generator().manual_seed(7)).to(dtype)


def build_ring_cache_decode_bf16() -> Dict[str, object]:
    """A bf16 layer decoding five tokens on two of three cache slots, then the cache resized."""
    attn = KimiDeltaAttention(16).to(torch.bfloat16)
    cache = KDARingCache(3, **attn.dims, dtype=torch.bfloat16)
    slot_idx = torch.tensor([2, 0], dtype=torch.int32)
    tokens = _tokens(2, 5, torch.bfloat16)
    with torch.no_grad():
        outs = [attn.step(tokens[:, t], slot_idx, cache.decode_kwargs()) for t in range(5)]
    cache.resize(4)
    return {"cache": cache, "out": torch.stack(outs, 1)}


def build_pinned_cache_cast() -> nn.Module:
    """A layer with a pinned cache after three float32 tokens, then cast to bf16 as one module."""
    layer = nn.ModuleDict({"attn": KimiDeltaAttention(16)})
    layer["cache"] = StreamingRingCache(2, **layer["attn"].dims)
    tokens = _tokens(2, 3, torch.float32)
    with torch.no_grad():
        for t in range(3):
            layer["attn"].step(tokens[:, t], torch.tensor([0, 1], dtype=torch.int32), layer["cache"].decode_kwargs())
    return layer.to(torch.bfloat16)


def build_bounded_prefill_bf16() -> Dict[str, object]:
    """A bf16 layer with bounded gates: a three-token prompt prefilled, then two decode steps."""
    attn = KimiDeltaAttention(16, lower_bound=-5.0).to(torch.bfloat16)
    ctx = attn.new_context(2, torch.bfloat16)
    tokens = _tokens(2, 5, torch.bfloat16)
    with torch.no_grad():
        prompt_out = attn.prefill(tokens[:, :3], ctx)
        outs = [attn.step(tokens[:, t], torch.arange(2, dtype=torch.int32), ctx.decode_kwargs()) for t in (3, 4)]
    return {"context": ctx, "prompt_out": prompt_out, "out": torch.stack(outs, 1)}
