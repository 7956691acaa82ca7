from __future__ import annotations

from typing import Optional

from torch import nn

from vllm_v1_kda.config import LoadConfig, ModelConfig, VllmConfig
from vllm_v1_kda.model_executor.model_loader.default_loader import (
    BaseModelLoader,
    DefaultModelLoader,
    DummyModelLoader,
)


def get_model_loader(load_config: LoadConfig) -> BaseModelLoader:
    """Get a model loader based on the load format."""
    if load_config.load_format == "dummy":
        return DummyModelLoader(load_config)
    return DefaultModelLoader(load_config)


def get_model(*, vllm_config: VllmConfig, model_config: Optional[ModelConfig] = None) -> nn.Module:
    loader = get_model_loader(vllm_config.load_config)
    if model_config is None:
        model_config = vllm_config.model_config
    return loader.load_model(vllm_config=vllm_config, model_config=model_config)


__all__ = ["get_model", "get_model_loader", "BaseModelLoader", "DefaultModelLoader", "DummyModelLoader"]
