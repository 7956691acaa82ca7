from typing import Dict, Optional, Type

from torch import nn

from .base_config import QuantizationConfig, QuantizeMethodBase
from .kv_cache import BaseKVCacheMethod, Fp8Config, Int8KVConfig

QUANTIZATION_METHODS: Dict[str, Type[QuantizationConfig]] = {
    "fp8": Fp8Config,
    "int8_kv": Int8KVConfig,
}


def get_quantization_config(quantization: str) -> Type[QuantizationConfig]:
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"Invalid quantization method: {quantization}")
    return QUANTIZATION_METHODS[quantization]


class _KVCacheProbe(nn.Module):
    is_kv_cache_layer = True


def get_kv_cache_method(quant_config: Optional[QuantizationConfig], prefix: str = "model.layers.0.self_attn") -> BaseKVCacheMethod:
    """The KV-cache method the cache engine sizes rings with (unquantized when there is none)."""
    method = quant_config.get_quant_method(_KVCacheProbe(), prefix) if quant_config is not None else None
    return method if isinstance(method, BaseKVCacheMethod) else BaseKVCacheMethod()


__all__ = ["QuantizationConfig", "QuantizeMethodBase", "QUANTIZATION_METHODS", "get_quantization_config", "get_kv_cache_method"]
