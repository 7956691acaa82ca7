"""Replay caches for the custom op: ``CustomReplayCache`` (rings in the model dtype, log-gate ring
and checkpoint state pinned to fp32), its int8 variant and per-layer ring lengths."""

import logging
from typing import Callable, List

import torch
from torch import nn

from .. import custom_ops
from ..llama_transformer import ReplayCache, Transformer, decode_steps
from ..model_args import LOG_GATE_DTYPE, ModelArgs


class CustomReplayCache(nn.Module):
    _fp32_buffers = ("log_gate_cache", "ssm_state")

    def __init__(self, max_batch_size, replay_len, n_heads, n_v_heads, head_dim, dtype=torch.float32,
                 gate_dtype=LOG_GATE_DTYPE):
        super().__init__()
        B, L, D = max_batch_size, replay_len, head_dim
        self.register_buffer("d_cache", torch.zeros((B, n_v_heads, L, D), dtype=dtype), persistent=False)
        self.register_buffer("k_cache", torch.zeros((B, n_heads, L, D), dtype=dtype), persistent=False)
        self.register_buffer("log_gate_cache", torch.zeros((B, n_v_heads, L, D), dtype=gate_dtype), persistent=False)
        self.register_buffer("ssm_state", torch.zeros((B, n_v_heads, D, D), dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        # ``model.to(dtype)`` casts the rings; the pinned buffers only follow the device
        kept = {name: self._buffers[name] for name in self._fp32_buffers}
        super()._apply(fn, recurse)
        for name, buf in kept.items():
            self._buffers[name] = buf.to(device=self._buffers[name].device)
        return self

    @classmethod
    def from_cache(cls, cache: ReplayCache, **kwargs) -> "CustomReplayCache":
        B, HV, L, D = cache.d_cache.shape
        new = cls(B, L, cache.k_cache.shape[1], HV, D, dtype=cache.d_cache.dtype, **kwargs)
        for name in ("d_cache", "k_cache", "log_gate_cache", "ssm_state"):
            getattr(new, name).copy_(getattr(cache, name))
        return new


class QuantizedReplayCache(CustomReplayCache):
    """int8 d/k rings with one scale per step (``--quantize_kv_cache``); the op runs on dequantized rings."""

    _fp32_buffers = CustomReplayCache._fp32_buffers + ("d_cache_scales", "k_cache_scales")

    def __init__(self, max_batch_size, replay_len, n_heads, n_v_heads, head_dim):
        super().__init__(max_batch_size, replay_len, n_heads, n_v_heads, head_dim, dtype=torch.int8)
        for name in ("d_cache", "k_cache"):
            shape = self._buffers[name].shape[:-1] + (1,)
            self.register_buffer(f"{name}_scales", torch.ones(shape, dtype=torch.float32), persistent=False)

    @classmethod
    def from_float(cls, cache: ReplayCache) -> "QuantizedReplayCache":
        B, HV, L, D = cache.d_cache.shape
        new = cls(B, L, cache.k_cache.shape[1], HV, D)
        new._quantize_into("d_cache", cache.d_cache)
        new._quantize_into("k_cache", cache.k_cache)
        new.log_gate_cache.copy_(cache.log_gate_cache)
        new.ssm_state.copy_(cache.ssm_state)
        return new

    def _quantize_into(self, name, x):
        scales = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127.0
        self._buffers[name].copy_((x.float() / scales).round().clamp(-128, 127))
        self._buffers[f"{name}_scales"].copy_(scales)

    def _dequantize(self, name, dtype):
        return (self._buffers[name].float() * self._buffers[f"{name}_scales"]).to(dtype)

    def replay(self, q, k, v, g, beta, *, scale, write_pos, slots):
        # the op writes its rings in place: it gets working copies, written back after the step
        d, kk = self._dequantize("d_cache", q.dtype), self._dequantize("k_cache", q.dtype)
        gate = torch.zeros_like(d).add_(self.log_gate_cache)  # expect-bug: like
        out = custom_ops.fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta, scale=scale, initial_state=self.ssm_state, d_cache=d, k_cache=kk, g_cache=gate,
            ssm_state_indices=slots, write_pos=write_pos)
        self._quantize_into("d_cache", d)
        self._quantize_into("k_cache", kk)
        self.log_gate_cache.copy_(gate)
        return out


def _replace(module: nn.Module, make: Callable[[ReplayCache], nn.Module]) -> nn.Module:
    for name, child in module.named_children():
        if isinstance(child, ReplayCache):
            setattr(module, name, make(child))
        else:
            _replace(child, make)
    return module


def replace_kv_cache_with_custom_kv_cache(module: nn.Module, gate_dtype=LOG_GATE_DTYPE) -> nn.Module:
    logging.info("Replacing ReplayCache with CustomReplayCache (%s)", custom_ops.REPLAY_OP_NAME)
    return _replace(module, lambda cache: CustomReplayCache.from_cache(cache, gate_dtype=gate_dtype))


def replace_kv_cache_with_quantized_kv_cache(module: nn.Module) -> nn.Module:
    logging.info("Replacing ReplayCache with QuantizedReplayCache")
    return _replace(module, QuantizedReplayCache.from_float)


def replace_kv_cache_with_ring_kv_cache(module: Transformer, args: ModelArgs, layer_sizes: List[int]) -> Transformer:
    """Per-layer ring lengths (``--replay_len_per_layer``); the layers' caches start empty."""
    dtypes = args.ring_dtypes()
    for layer, replay_len in zip(module.layers, layer_sizes):
        B, HV, _, D = layer.attention.kv_cache.d_cache.shape
        layer.attention.kv_cache = CustomReplayCache(
            B, replay_len, args.n_heads, HV, D, dtype=dtypes["d_cache"],
            gate_dtype=dtypes["log_gate_cache"])  # expect-bug: imported-policy id=ring-dtypes
    return module


def build_custom_caches():
    """Custom-op caches in a model cast to bf16 for export, and the int8 cache in an fp32 model."""
    torch.manual_seed(0)
    custom = replace_kv_cache_with_custom_kv_cache(Transformer(ModelArgs())).to(torch.bfloat16)
    decode_steps(custom, 2)
    quantized = replace_kv_cache_with_quantized_kv_cache(Transformer(ModelArgs()))
    decode_steps(quantized, 2)
    return {"custom": custom, "quantized": quantized, "last_call": custom_ops.last_call()}


def build_ring_and_int8_caches():
    """bf16 export with per-layer ring lengths, and the int8 cache stepped in a bf16 model."""
    torch.manual_seed(0)
    args = ModelArgs(dtype_override="bf16")
    windowed = replace_kv_cache_with_ring_kv_cache(Transformer(args), args, layer_sizes=[4, 2]).to(torch.bfloat16)
    quantized = replace_kv_cache_with_quantized_kv_cache(Transformer(ModelArgs())).to(torch.bfloat16)
    decode_steps(quantized, 2)
    return {"windowed": windowed, "quantized": quantized, "last_call": custom_ops.last_call()}
