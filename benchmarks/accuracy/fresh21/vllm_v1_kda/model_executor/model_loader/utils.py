"""Utilities for selecting and loading models (vllm/model_executor/model_loader/utils.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Optional

import torch
from torch import nn

from vllm_v1_kda.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm_v1_kda.model_executor.models import ModelRegistry


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets the default torch dtype to the given dtype."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    yield
    torch.set_default_dtype(old_dtype)


def get_model_architecture(model_config: ModelConfig) -> tuple[type[nn.Module], str]:
    return ModelRegistry.resolve_model_cls(model_config.architecture)


def initialize_model(
    vllm_config: VllmConfig, *, prefix: str = "", model_config: Optional[ModelConfig] = None
) -> nn.Module:
    """Initialize a model with the given configurations."""
    if model_config is None:
        model_config = vllm_config.model_config
    model_class, _ = get_model_architecture(model_config)
    with set_current_vllm_config(vllm_config):
        return model_class(vllm_config=vllm_config, model_config=model_config, prefix=prefix)


def process_weights_after_loading(model: nn.Module, model_config: ModelConfig, target_device: torch.device) -> None:
    for _, module in model.named_modules():
        process = getattr(module, "process_weights_after_loading", None)
        if callable(process):
            process()
