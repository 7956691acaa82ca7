"""A streaming KDA encoder for CTC ASR (``speechbrain.lobes.models`` layout).

Offline, frames are decoded on the ``KDARingCache`` slots the encoder owns (``decode_slots``);
streaming passes a ``KDAStreamingContext`` from chunk to chunk (``encode_streaming``), like
the ``make_streaming_context``/``encode_streaming`` pair of the Conformer models.

>>> enc = KDAEncoder(input_size=6)
>>> enc.encode_streaming(torch.rand(2, 3, 6), enc.make_streaming_context(2)).shape
torch.Size([2, 3, 16])
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Type

import torch
from torch import nn

from sb_kda.nnet import kda_ops
from sb_kda.nnet.kimi_delta import (
    KDALayerStreamingContext,
    KDARingCache,
    KimiDeltaAttention,
    StreamingPrecision,
    ring_shapes,
)
from sb_kda.utils import data_utils


def streaming_precision(model_dtype: torch.dtype, eval_precision: str = "fp32") -> StreamingPrecision:
    """Context storage for a model in ``model_dtype`` run under ``eval_precision``.

    The rings follow the model; float16 keeps the log-forget ring in float32 (long products
    of decays underflow), bfloat16 has the float32 exponent range.
    """
    if model_dtype == torch.float16 or eval_precision == "fp16":
        return StreamingPrecision(ring_dtype=model_dtype, forget_dtype=torch.float32)
    return StreamingPrecision(ring_dtype=model_dtype, forget_dtype=model_dtype)  # expect-bug: imported-policy id=context-precision


@dataclass
class KDAStreamingContext:
    """Streaming context of a ``KDAEncoder``; ``slot_idx [B]`` (int32) maps chunk rows to slots."""

    layers: List[KDALayerStreamingContext]
    slot_idx: torch.Tensor
    frames_seen: int = 0

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "KDAStreamingContext":
        """Moves the context to ``device``; ``dtype`` is the storage of the rings (the memory stays float32)."""
        layers = [
            KDALayerStreamingContext(
                memory=layer.memory.to(device),
                delta_ring=layer.delta_ring.to(device, dtype),
                key_ring=layer.key_ring.to(device, dtype),
                forget_ring=layer.forget_ring.to(device, dtype),  # expect-bug: cast id=park-context
                write_pos=layer.write_pos.to(device),
            )
            for layer in self.layers
        ]
        return KDAStreamingContext(layers, self.slot_idx.to(device), self.frames_seen)

    def fresh_like(self) -> "KDAStreamingContext":
        """An empty context with the shapes and dtypes of this one (the next batch of streams)."""
        layers = [
            KDALayerStreamingContext(
                memory=torch.zeros_like(layer.memory),
                delta_ring=torch.zeros_like(layer.delta_ring),
                key_ring=torch.zeros_like(layer.key_ring),
                forget_ring=torch.zeros_like(layer.delta_ring),  # expect-bug: like
                write_pos=torch.zeros_like(layer.write_pos),
            )
            for layer in self.layers
        ]
        return KDAStreamingContext(layers, self.slot_idx.clone())


class KDAEncoderLayer(nn.Module):
    def __init__(self, d_model, dim_ffn, **attn_kwargs):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = KimiDeltaAttention(d_model, **attn_kwargs)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, dim_ffn), nn.SiLU(), nn.Linear(dim_ffn, d_model))

    def forward_step(self, x, slot_idx, rings: Dict[str, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn.step(self.norm1(x), slot_idx, rings)
        return x + self.ffn(self.norm2(x))


class KDAEncoder(nn.Module):
    """Stack of pre-norm KDA blocks; ``num_slots`` attaches ``cache_class`` buffers for ``decode_slots``."""

    def __init__(self, input_size, d_model=16, num_layers=2, dim_ffn=32, num_heads=2, num_v_heads=4,
                 head_dim=8, v_head_dim=8, ring_len=4, lower_bound=None, num_slots=None,
                 cache_class: Type[KDARingCache] = KDARingCache):
        super().__init__()
        self.input_proj = nn.Linear(input_size, d_model)
        attn_kwargs = dict(num_heads=num_heads, num_v_heads=num_v_heads, head_dim=head_dim,
                           v_head_dim=v_head_dim, ring_len=ring_len, lower_bound=lower_bound)
        self.layers = nn.ModuleList(KDAEncoderLayer(d_model, dim_ffn, **attn_kwargs) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.ring_caches = nn.ModuleList()
        if num_slots:
            self.attach_ring_caches(num_slots, cache_class)

    @property
    def dtype(self) -> torch.dtype:
        return self.input_proj.weight.dtype

    @property
    def dims(self) -> Dict[str, int]:
        return self.layers[0].attn.dims

    def context_shapes(self, batch_size: int) -> Dict[str, Tuple[int, ...]]:
        return ring_shapes(batch_size, **self.dims)

    def attach_ring_caches(self, num_slots: int, cache_class: Type[KDARingCache] = KDARingCache) -> None:
        self.ring_caches = nn.ModuleList(cache_class(num_slots, **self.dims, dtype=self.dtype) for _ in self.layers)

    def reset_ring_caches(self) -> None:
        for cache in self.ring_caches:
            cache.reset()

    def _frames(self, x, slot_idx, rings: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
        frames = []
        for t in range(x.shape[1]):
            h = x[:, t]
            for layer, layer_rings in zip(self.layers, rings):
                h = layer.forward_step(h, slot_idx, layer_rings)
            frames.append(h)
        return self.norm(torch.stack(frames, 1))

    def decode_slots(self, src: torch.Tensor, slot_idx: torch.Tensor) -> torch.Tensor:
        """Encodes ``src [B, T, F]`` frame by frame on the attached ring caches."""
        x = self.input_proj(src.to(self.dtype))
        return self._frames(x, slot_idx, [cache.decode_kwargs() for cache in self.ring_caches])

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        return self.encode_streaming(src, self.make_streaming_context(src.shape[0]))

    def make_streaming_context(self, batch_size: int, precision: Optional[StreamingPrecision] = None) -> KDAStreamingContext:
        if precision is None:
            layers = [layer.attn.new_context(batch_size, self.dtype) for layer in self.layers]
        else:
            layers = [KDALayerStreamingContext.allocate(self.context_shapes(batch_size), precision) for _ in self.layers]
        return KDAStreamingContext(layers, torch.arange(batch_size, dtype=torch.int32))

    def encode_streaming(self, chunk: torch.Tensor, context: KDAStreamingContext, offload: bool = False) -> torch.Tensor:
        """Encodes ``chunk [B, T, F]`` and advances ``context`` (``offload``: it lives on the CPU)."""
        x = self.input_proj(chunk.to(self.dtype))
        rings = [layer.decode_kwargs() for layer in context.layers]
        if offload:
            rings = data_utils.recursive_to(rings, device=x.device, dtype=x.dtype)  # expect-bug: decode-arg
        out = self._frames(x, context.slot_idx, rings)
        context.frames_seen += chunk.shape[1]
        return out

    def prime_context(self, prompt: torch.Tensor, context: KDAStreamingContext) -> torch.Tensor:
        """Runs a prompt (shorter than a ring) into a fresh context in one pass per layer."""
        h = self.input_proj(prompt.to(self.dtype))
        for layer, layer_ctx in zip(self.layers, context.layers):
            h = h + layer.attn.prefill(layer.norm1(h), layer_ctx)
            h = h + layer.ffn(layer.norm2(h))
        context.frames_seen += prompt.shape[1]
        return self.norm(h)

    def grow_context(self, context: KDAStreamingContext, num_new: int) -> KDAStreamingContext:
        """Appends ``num_new`` empty streams; existing rows keep their slots and contents."""
        for layer_ctx in context.layers:
            old = layer_ctx.memory.shape[0]
            for name in ("delta_ring", "key_ring", "forget_ring"):
                ring = getattr(layer_ctx, name)
                grown = torch.zeros((old + num_new, *ring.shape[1:]), dtype=self.dtype, device=ring.device)  # expect-bug: pool-dtype
                grown[:old] = ring
                setattr(layer_ctx, name, grown)
            memory = torch.zeros((old + num_new, *layer_ctx.memory.shape[1:]), dtype=torch.float32)
            memory[:old] = layer_ctx.memory
            layer_ctx.memory = memory
            layer_ctx.write_pos = torch.cat([layer_ctx.write_pos, layer_ctx.write_pos.new_zeros(num_new)])
        total = context.layers[0].memory.shape[0]
        context.slot_idx = torch.arange(total, dtype=torch.int32)
        return context


def _features(batch: int, frames: int, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, 6, generator=gen)


def build_encoder_streaming_bf16() -> Dict[str, object]:
    """A bf16 encoder: a primed context and a fresh one, each fed two chunks, then moved to CPU."""
    enc = KDAEncoder(6).to(torch.bfloat16)
    feats = _features(2, 8)
    with torch.no_grad():
        primed = enc.make_streaming_context(2)
        enc.prime_context(feats[:, :3], primed)
        enc.encode_streaming(feats[:, 3:], primed)
        fresh = enc.make_streaming_context(2)
        outs = [enc.encode_streaming(chunk, fresh) for chunk in feats.split(3, dim=1)]
    return {"primed": primed.to("cpu"), "fresh": fresh, "out": torch.cat(outs, 1)}


def build_encoder_grow_fp32() -> Dict[str, object]:
    """A float32 encoder: two streams grown to three, and an offloaded context."""
    enc = KDAEncoder(6)
    feats = _features(3, 6)
    with torch.no_grad():
        ctx = enc.make_streaming_context(2)
        enc.encode_streaming(feats[:2, :3], ctx)
        enc.grow_context(ctx, 1)
        enc.encode_streaming(feats[:, 3:], ctx)
        parked = enc.make_streaming_context(3)
        out = enc.encode_streaming(feats, parked, offload=True)
    return {"grown": ctx, "offloaded": parked, "out": out}


def build_encoder_offload_bf16() -> Dict[str, object]:
    """A bf16 encoder decoding with an offloaded context; the last decode call is recorded."""
    enc = KDAEncoder(6).to(torch.bfloat16)
    ctx = enc.make_streaming_context(2, StreamingPrecision(torch.bfloat16, torch.float32))
    with torch.no_grad():
        out = enc.encode_streaming(_features(2, 5), ctx, offload=True)
    return {"context": ctx, "last_call": kda_ops.last_decode_call(), "out": out}


def build_context_restart_bf16() -> Dict[str, object]:
    """A bf16 encoder: after a batch of streams, a fresh context for the next batch and a grown one."""
    enc = KDAEncoder(6).to(torch.bfloat16)
    feats = _features(2, 6)
    with torch.no_grad():
        first = enc.make_streaming_context(2)
        enc.encode_streaming(feats, first)
        second = first.fresh_like()
        enc.encode_streaming(feats[:, :3], second)
        grown = enc.make_streaming_context(2)
        enc.encode_streaming(feats[:, :2], grown)
        enc.grow_context(grown, 2)
    return {"first": first, "second": second, "grown": grown}
