"""Model loaders: default (checkpoint files) and dummy (random weights)."""
import contextlib
import os
from abc import ABC, abstractmethod
from typing import Any, Dict, Generator, Optional

import torch
from torch import nn

from ...common.config import CacheConfig, DeviceConfig, LoadConfig, ModelConfig, SchedulerConfig
from ...common.logger import init_logger
from ...common.utils import STR_DTYPE_TO_TORCH_DTYPE
from ..layers.quantization import QuantizationConfig, get_quantization_config
from ..models import ModelRegistry
from .weight_utils import initialize_dummy_weights, iterate_weights, save_safetensors

logger = init_logger(__name__)


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Generator[None, None, None]:
    """Sets the default torch dtype to the given dtype."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)


def cast_module_keep_fp32(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Casts parameters and floating buffers to ``dtype``, except the buffers the model lists in
    ``keep_fp32_buffers`` (recurrent state, log-decay rings)."""
    keep = set(getattr(model, "keep_fp32_buffers", ()))
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            param.data = param.data.to(dtype)
        for name, buf in module.named_buffers(recurse=False):
            if buf.is_floating_point() and name not in keep:
                setattr(module, name, buf.to(dtype))
    return model


def _get_quantization_config(model_config: ModelConfig) -> Optional[QuantizationConfig]:
    if model_config.quantization is None:
        return None
    quant_cls = get_quantization_config(model_config.quantization)
    quant_config = quant_cls.from_config(model_config.hf_config.get("quantization_config", {}))
    if model_config.dtype not in quant_config.get_supported_act_dtypes():
        raise ValueError(f"{model_config.dtype} is not supported for quantization method {model_config.quantization}.")
    return quant_config


def _initialize_model(model_config: ModelConfig, cache_config: Optional[CacheConfig], scheduler_config: Optional[SchedulerConfig]) -> nn.Module:
    architecture = model_config.hf_config.get("architectures", ["KimiLinearForCausalLM"])[0]
    model_class = ModelRegistry.load_model_cls(architecture)
    extra: Dict[str, Any] = {}
    if scheduler_config is not None:
        extra["max_num_seqs"] = scheduler_config.max_num_seqs
    return model_class(config=model_config.hf_config, cache_config=cache_config, quant_config=_get_quantization_config(model_config), **extra)


class BaseModelLoader(ABC):
    def __init__(self, load_config: LoadConfig) -> None:
        self.load_config = load_config

    def _target_dtype(self, model_config: ModelConfig) -> torch.dtype:
        if self.load_config.load_dtype:
            return STR_DTYPE_TO_TORCH_DTYPE[self.load_config.load_dtype]
        return model_config.dtype

    def load_model(
        self,
        *,
        model_config: ModelConfig,
        device_config: DeviceConfig,
        cache_config: Optional[CacheConfig] = None,
        scheduler_config: Optional[SchedulerConfig] = None,
        **kwargs: Any,
    ) -> nn.Module:
        target_dtype = self._target_dtype(model_config)
        with set_default_torch_dtype(target_dtype):  # expect-bug: default-dtype id=owned-default
            with torch.device(device_config.device):
                model = _initialize_model(model_config, cache_config, scheduler_config)
            self._load_weights(model, model_config)
            for module in model.modules():
                method = getattr(module, "kv_cache_method", None)
                if method is not None:
                    method.process_weights_after_loading(module)
        if target_dtype != model_config.dtype:
            logger.info("Loaded weights in %s; casting to %s", target_dtype, model_config.dtype)
            cast_module_keep_fp32(model, model_config.dtype)
        return model.eval()

    @abstractmethod
    def _load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        raise NotImplementedError


class DefaultModelLoader(BaseModelLoader):
    def _load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        weights = iterate_weights(model_config.model, self.load_config.load_format, self.load_config.download_dir)
        model.load_weights(weights)


class DummyModelLoader(BaseModelLoader):
    def _load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        # NOTE: random values give non-finite logits less often when kept small.
        initialize_dummy_weights(model)


def get_model_loader(load_config: LoadConfig) -> BaseModelLoader:
    if load_config.load_format == "dummy":
        return DummyModelLoader(load_config)
    return DefaultModelLoader(load_config)


def build_model_owned_cache() -> Dict[str, Any]:
    """A bf16 model with per-layer in-model ReplaySSM caches, dummy weights."""
    model_config = ModelConfig("kimi-linear-tiny", dtype="bfloat16")
    model = get_model_loader(LoadConfig(load_format="dummy")).load_model(
        model_config=model_config, device_config=DeviceConfig("cpu"), cache_config=CacheConfig(in_model_cache=True),
        scheduler_config=SchedulerConfig(max_num_seqs=3),
    )
    return {"state_caches": model.state_caches, "embed": model.embed_tokens.weight}


def build_safetensors_fp32_load(tmp_dir: str) -> Dict[str, Any]:
    """Weights written as float32 safetensors, loaded in float32 and cast to bf16 for serving."""
    torch.manual_seed(0)
    reference = _initialize_model(ModelConfig("ref", dtype="float32"), None, None)
    checkpoint = {f"model.{name}" if not name.startswith("lm_head") else name: p for name, p in reference.state_dict().items()}
    save_safetensors(checkpoint, os.path.join(tmp_dir, "model-00001-of-00001.safetensors"))
    model = get_model_loader(LoadConfig(load_format="safetensors", load_dtype="float32")).load_model(
        model_config=ModelConfig(tmp_dir, dtype="bfloat16"), device_config=DeviceConfig("cpu"),
        cache_config=CacheConfig(in_model_cache=True), scheduler_config=SchedulerConfig(max_num_seqs=2),
    )
    return {"state_caches": model.state_caches, "q_proj": model.layers[0].self_attn.q_proj.weight}
