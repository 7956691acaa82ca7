# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
"""
``quantize_(model, config)`` walks ``model`` and applies the handler registered for
``type(config)`` to every module that ``filter_fn`` matches.
"""
import types
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from torchao_kda._models.model import KDAAttention, ModelArgs, ReplaySSMCache, Transformer
from torchao_kda.utils import TorchAOBaseTensor, get_model_size_in_bytes, torch_default_dtype

class AOBaseConfig:
    """Base class of every config passed to ``quantize_``."""


_QUANTIZE_CONFIG_HANDLER: Dict[Type[AOBaseConfig], Callable] = {}


def register_quantize_module_handler(config_type: Type[AOBaseConfig]):
    def decorator(func):
        _QUANTIZE_CONFIG_HANDLER[config_type] = func
        return func

    return decorator


@dataclass
class Int8WeightOnlyConfig(AOBaseConfig):
    group_size: Optional[int] = None


@dataclass
class ReplayCacheConfig(AOBaseConfig):
    """dtypes (and optionally the number of slots) of ReplaySSMCache modules."""

    ring_dtype: torch.dtype = torch.bfloat16
    gate_dtype: torch.dtype = torch.float32
    max_batch_size: Optional[int] = None

    @classmethod
    def from_model_args(cls, args: ModelArgs, max_batch_size: Optional[int] = None):
        return cls(ring_dtype=args.cache_dtype, gate_dtype=args.cache_dtype, max_batch_size=max_batch_size)  # expect-bug: imported-policy


@dataclass
class Float16ReplayCacheConfig(ReplayCacheConfig):
    """ReplayCacheConfig for GPUs without bfloat16 (V100, T4)."""

    ring_dtype: torch.dtype = torch.float16
    gate_dtype: torch.dtype = torch.float16  # expect-bug: container


@dataclass
class MixedPrecisionConfig(AOBaseConfig):
    """Runs the matched modules (by default the KDA attention blocks) in ``dtype``."""

    dtype: torch.dtype = torch.bfloat16


class AffineQuantizedTensor(TorchAOBaseTensor):
    """Symmetric per-row int8 weight."""

    tensor_data_names = ("int_data", "scale")

    def __init__(self, int_data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self.int_data, self.scale, self.dtype = int_data, scale, dtype

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "AffineQuantizedTensor":
        scale = weight.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-6) / 127
        return cls(torch.round(weight.detach().float() / scale).to(torch.int8), scale, weight.dtype)

    def dequantize(self, output_dtype=None) -> torch.Tensor:
        return (self.int_data.float() * self.scale).to(output_dtype or self.dtype)


def _is_linear(mod: nn.Module, fqn: str) -> bool:
    return isinstance(mod, nn.Linear) and hasattr(mod, "weight")


def _is_replay_cache(mod: nn.Module, fqn: str) -> bool:
    return isinstance(mod, ReplaySSMCache)


def _is_kda_attention(mod: nn.Module, fqn: str) -> bool:
    return isinstance(mod, KDAAttention)


def _replace_with_custom_fn_if_matches_filter(model, replacement_fn, filter_fn, cur_fqn="", extra_args=()):
    if filter_fn(model, cur_fqn[:-1]):
        return replacement_fn(model, *extra_args)
    for name, child in list(model.named_children()):
        new_child = _replace_with_custom_fn_if_matches_filter(child, replacement_fn, filter_fn, f"{cur_fqn}{name}.", extra_args)
        if new_child is not child:
            setattr(model, name, new_child)
    return model


def quantize_(model: nn.Module, config: AOBaseConfig, filter_fn: Optional[Callable] = None):
    handler = _QUANTIZE_CONFIG_HANDLER[type(config)]
    if filter_fn is None:
        if isinstance(config, ReplayCacheConfig):
            filter_fn = _is_replay_cache
        elif isinstance(config, MixedPrecisionConfig):
            filter_fn = _is_kda_attention
        else:
            filter_fn = _is_linear
    _replace_with_custom_fn_if_matches_filter(model, handler, filter_fn, extra_args=(config,))


@register_quantize_module_handler(Int8WeightOnlyConfig)
def _int8_weight_only_transform(module: nn.Linear, config: Int8WeightOnlyConfig) -> nn.Linear:
    module.weight_aqt = AffineQuantizedTensor.from_float(module.weight)
    del module.weight
    module.forward = types.MethodType(lambda self, x: F.linear(x, self.weight_aqt.dequantize(x.dtype), self.bias), module)
    return module


@register_quantize_module_handler(ReplayCacheConfig)
@register_quantize_module_handler(Float16ReplayCacheConfig)
def _replay_cache_transform(module: ReplaySSMCache, config: ReplayCacheConfig) -> ReplaySSMCache:
    if config.max_batch_size is None:
        module.d_cache = module.d_cache.to(config.ring_dtype)
        module.k_cache = module.k_cache.to(config.ring_dtype)
        module.log_alpha = module.log_alpha.to(config.ring_dtype)  # expect-bug: cast
        return module
    B = config.max_batch_size
    with torch_default_dtype(config.ring_dtype):
        # fresh rings, the next prefill fills the slots
        module.d_cache = torch.zeros(B, *module.d_cache.shape[1:])
        module.k_cache = torch.zeros(B, *module.k_cache.shape[1:])
        module.log_alpha = torch.zeros(B, *module.log_alpha.shape[1:], dtype=config.gate_dtype)
    module.state = torch.zeros(B, *module.state.shape[1:], dtype=torch.float32)
    module.write_pos = torch.zeros(B, dtype=torch.int32)
    return module


@register_quantize_module_handler(MixedPrecisionConfig)
def _mixed_precision_transform(module: nn.Module, config: MixedPrecisionConfig) -> nn.Module:
    module = module.to(dtype=config.dtype)  # expect-bug: module-cast
    forward = module.forward
    module.forward = lambda x, *args: forward(x.to(config.dtype), *args).to(x.dtype)
    return module


def _prefill(model: Transformer, n: int):
    slots = torch.arange(n, dtype=torch.int32)
    logits = model(torch.arange(5).repeat(n, 1) + slots[:, None], slots)
    return model(logits[:, -1].argmax(-1)[:, None], slots)


def build_quantized():
    model = Transformer.from_name("Kimi-Linear-tiny-static")
    model.setup_caches(2)
    quantize_(model, Int8WeightOnlyConfig())
    quantize_(model, ReplayCacheConfig(max_batch_size=3))
    quantize_(model, MixedPrecisionConfig())
    logits = _prefill(model, 3)
    return {"model": model, "logits": logits, "size": torch.tensor(get_model_size_in_bytes(model))}


def build_quantized_caches():
    configs = {
        "inplace": ReplayCacheConfig(),
        "fp16": Float16ReplayCacheConfig(max_batch_size=2),
        "from_args": ReplayCacheConfig.from_model_args(ModelArgs(), max_batch_size=2),
        "mixed": MixedPrecisionConfig(),
    }
    models = {}
    for key, config in configs.items():
        models[key] = Transformer.from_name("Kimi-Linear-tiny")
        models[key].setup_caches(2)
        quantize_(models[key], config)
    return models
