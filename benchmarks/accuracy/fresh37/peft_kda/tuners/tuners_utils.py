"""Base classes shared by the tuners: injecting adapter layers into a model and the layer API."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Union

import torch
from torch import nn

from ..config import PeftConfig
from ..utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from ..utils.other import ModulesToSaveWrapper, _get_submodules


def check_target_module_exists(config: PeftConfig, key: str) -> bool:
    """Whether the module at ``key`` is one of ``config.target_modules`` (a regex or a list of names)."""
    target_modules = getattr(config, "target_modules", None)
    if target_modules is None:
        return False
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, key) is not None
    if key in target_modules:
        return True
    return any(key.endswith(f".{target}") for target in target_modules)


class BaseTunerLayer:
    """Mixin for adapter layers; ``adapter_layer_names`` are the ModuleDicts keyed by adapter."""

    adapter_layer_names: tuple = ()
    other_param_names: tuple = ()
    _disable_adapters = False
    _active_adapter: Union[str, List[str]] = "default"
    merged_adapters: List[str]

    def get_base_layer(self) -> nn.Module:
        base_layer = self
        while hasattr(base_layer, "base_layer"):
            base_layer = base_layer.base_layer
        return base_layer

    @property
    def merged(self) -> bool:
        return bool(self.merged_adapters)

    @property
    def disable_adapters(self) -> bool:
        return self._disable_adapters

    @property
    def active_adapter(self) -> Union[str, List[str]]:
        return self._active_adapter

    @property
    def active_adapters(self) -> List[str]:
        return [self._active_adapter] if isinstance(self._active_adapter, str) else list(self._active_adapter)

    def set_adapter(self, adapter_names: Union[str, List[str]]) -> None:
        names = [adapter_names] if isinstance(adapter_names, str) else adapter_names
        for layer_name in self.adapter_layer_names:
            module_dict = getattr(self, layer_name)
            for key, layer in module_dict.items():
                layer.requires_grad_(key in names)
        self._active_adapter = adapter_names

    def _cast_input_dtype(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x if x.dtype == dtype else x.to(dtype)

    def _move_adapter_to_device_of_base_layer(self, adapter_name: str) -> None:
        """New adapter weights go to the base layer's device and, when it is floating, its dtype."""
        weight = self.get_base_layer().weight
        for layer_name in self.adapter_layer_names:
            module_dict = getattr(self, layer_name, None)
            if module_dict is None or adapter_name not in module_dict:
                continue
            if weight.is_floating_point():
                module_dict[adapter_name].to(weight.device, dtype=weight.dtype)
            else:
                module_dict[adapter_name].to(weight.device)


class BaseTuner(nn.Module):
    """Replaces the target modules of ``model`` with adapter layers (``inject_adapter``)."""

    prefix: str = ""

    def __init__(self, model: nn.Module, peft_config: Dict[str, PeftConfig], adapter_name: str, low_cpu_mem_usage: bool = False) -> None:
        super().__init__()
        self.model = model
        self.peft_config: Dict[str, PeftConfig] = dict(peft_config)
        self.active_adapter: Union[str, List[str]] = adapter_name
        self.inject_adapter(self.model, adapter_name, low_cpu_mem_usage=low_cpu_mem_usage)
        self.model.peft_config = self.peft_config

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    @property
    def active_adapters(self) -> List[str]:
        return [self.active_adapter] if isinstance(self.active_adapter, str) else list(self.active_adapter)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.forward(*args, **kwargs)

    # hooks for the concrete tuners
    def _prepare_adapter_config(self, peft_config: PeftConfig, model_config: Any) -> PeftConfig:
        if getattr(peft_config, "target_modules", None) is None:
            model_type = getattr(model_config, "model_type", None)
            if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
                raise ValueError("Please specify `target_modules` in `peft_config`")
            peft_config.target_modules = set(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type])
        return peft_config

    def _create_and_replace(self, peft_config, adapter_name, target, target_name, parent, current_key) -> None:
        raise NotImplementedError

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        raise NotImplementedError

    def inject_adapter(self, model: nn.Module, adapter_name: str, low_cpu_mem_usage: bool = False) -> None:
        peft_config = self.peft_config[adapter_name]
        peft_config = self._prepare_adapter_config(peft_config, getattr(model, "config", None))
        is_target_modules_in_base_model = False
        key_list = [key for key, _ in model.named_modules()]
        for key in key_list:
            if "modules_to_save" in key or not check_target_module_exists(peft_config, key):
                continue
            parent, target, target_name = _get_submodules(model, key)
            if isinstance(target, ModulesToSaveWrapper):
                continue
            is_target_modules_in_base_model = True
            self._create_and_replace(peft_config, adapter_name, target, target_name, parent, current_key=key)
        if not is_target_modules_in_base_model:
            raise ValueError(f"Target modules {peft_config.target_modules} not found in the base model.")
        self.set_adapter(self.active_adapters)
        self._mark_only_adapters_as_trainable(model)
        if peft_config.inference_mode:
            for name, param in model.named_parameters():
                if adapter_name in name:
                    param.requires_grad = False

    def set_adapter(self, adapter_name: Union[str, List[str]]) -> None:
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.set_adapter(adapter_name)
        self.active_adapter = adapter_name
