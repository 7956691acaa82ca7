"""Model loaders (vllm/model_executor/model_loader/{base,default,dummy}_loader.py)."""

from __future__ import annotations

import glob
import os
from collections.abc import Generator

import torch
from torch import nn

from vllm_v1_kda.config import LoadConfig, ModelConfig, VllmConfig
from vllm_v1_kda.model_executor.model_loader.utils import (
    initialize_model,
    process_weights_after_loading,
    set_default_torch_dtype,
)
from vllm_v1_kda.model_executor.model_loader.weight_utils import initialize_dummy_weights, pt_weights_iterator


class BaseModelLoader:
    def __init__(self, load_config: LoadConfig) -> None:
        self.load_config = load_config

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        raise NotImplementedError

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig) -> nn.Module:
        """Load a model with the given configurations."""
        device_config = vllm_config.device_config
        target_device = torch.device(device_config.device)
        with set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = initialize_model(vllm_config=vllm_config, model_config=model_config)
            self.load_weights(model, model_config)
            process_weights_after_loading(model, model_config, target_device)
        return model.eval()


class DefaultModelLoader(BaseModelLoader):
    """Model loader that can load ``*.bin``/``*.pt`` checkpoints from a directory."""

    def _get_weights_iterator(self, model_config: ModelConfig) -> Generator[tuple[str, torch.Tensor], None, None]:
        model_dir = self.load_config.download_dir or model_config.model
        files = sorted(glob.glob(os.path.join(model_dir, "*.bin")) + glob.glob(os.path.join(model_dir, "*.pt")))
        if not files:
            raise RuntimeError(f"Cannot find any model weights in {model_dir}")
        return pt_weights_iterator(files)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        weights_to_load = {name for name, _ in model.named_parameters()}
        loaded_weights = model.load_weights(self._get_weights_iterator(model_config))
        weights_not_loaded = weights_to_load - loaded_weights
        if weights_not_loaded:
            raise ValueError(f"Following weights were not initialized from checkpoint: {sorted(weights_not_loaded)}")


class DummyModelLoader(BaseModelLoader):
    """Model loader that will set model weights to random values."""

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        # NOTE(woosuk): For accurate performance evaluation, we assign
        # random values to the weights.
        initialize_dummy_weights(model, seed=model_config.seed)
