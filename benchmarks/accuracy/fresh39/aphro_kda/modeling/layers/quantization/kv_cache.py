"""KV-cache quantization methods and the storage dtypes they give the KDA rings."""
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from ....common.logger import init_logger
from .base_config import QuantizationConfig, QuantizeMethodBase

logger = init_logger(__name__)

LINEAR_RINGS = ("delta_cache", "key_cache", "alpha_log_cache")


class BaseKVCacheMethod(QuantizeMethodBase):
    """KV-cache method of a softmax-attention or KDA layer: scales, and ring storage dtypes."""

    kv_dtype: Optional[torch.dtype] = None

    def __init__(self, quant_config: Optional[QuantizationConfig] = None) -> None:
        self.quant_config = quant_config

    def create_weights(self, layer: nn.Module, *weight_args: Any, **extra_weight_attrs: Any) -> None:
        layer.k_scale = nn.Parameter(torch.tensor(1.0), requires_grad=False)
        layer.v_scale = nn.Parameter(torch.tensor(1.0), requires_grad=False)

    def ring_dtypes(self, compute_dtype: torch.dtype) -> Dict[str, torch.dtype]:
        ring = self.kv_dtype or compute_dtype
        return {"ssm_state": torch.float32, "delta_cache": ring, "key_cache": ring, "alpha_log_cache": torch.float32}

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if layer.k_scale.item() <= 0.0:
            logger.warning("Checkpoint has a non-positive k_scale; using 1.0 for %s", type(layer).__name__)
            layer.k_scale.fill_(1.0)


class Fp8KVCacheMethod(BaseKVCacheMethod):
    kv_dtype = torch.float8_e4m3fn


class Int8KVCacheMethod(BaseKVCacheMethod):
    kv_dtype = torch.int8

    def ring_dtypes(self, compute_dtype: torch.dtype) -> Dict[str, torch.dtype]:
        # int8 KV covers the softmax-attention layers only: the delta-rule rings are accumulated
        # in place and stay in the compute dtype.
        rings = {name: compute_dtype for name in LINEAR_RINGS}  # expect-bug: imported-policy id=int8-rings
        return {"ssm_state": torch.float32, **rings}


class _KVCacheQuantConfig(QuantizationConfig):
    method_cls = BaseKVCacheMethod
    name = "none"

    def __init__(self, activation_scheme: str = "dynamic") -> None:
        self.activation_scheme = activation_scheme

    def get_name(self) -> str:
        return self.name

    def get_supported_act_dtypes(self) -> List[torch.dtype]:
        return [torch.bfloat16, torch.half]

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "QuantizationConfig":
        return cls(cls.get_from_keys(config, ["activation_scheme"], "dynamic"))

    def get_quant_method(self, layer: nn.Module, prefix: str = "") -> Optional[QuantizeMethodBase]:
        if getattr(layer, "is_kv_cache_layer", False) or prefix.endswith((".attn", ".self_attn")):
            return self.method_cls(self)
        return None


class Fp8Config(_KVCacheQuantConfig):
    method_cls = Fp8KVCacheMethod
    name = "fp8"


class Int8KVConfig(_KVCacheQuantConfig):
    method_cls = Int8KVCacheMethod
    name = "int8_kv"
