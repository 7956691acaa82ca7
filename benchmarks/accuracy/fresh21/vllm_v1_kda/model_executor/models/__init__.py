"""Architecture name -> model class (vllm/model_executor/models/registry.py)."""

from __future__ import annotations

import importlib

from torch import nn

_MODELS = {
    "KimiLinearForCausalLM": ("kimi_linear", "KimiLinearForCausalLM"),
    "KimiMTPModel": ("kimi_mtp", "KimiMTP"),
}


class _ModelRegistry:
    def get_supported_archs(self) -> list[str]:
        return list(_MODELS)

    def resolve_model_cls(self, architecture: str) -> tuple[type[nn.Module], str]:
        if architecture not in _MODELS:
            raise ValueError(f"Model architecture {architecture} is not supported. Supported: {self.get_supported_archs()}")
        module_name, class_name = _MODELS[architecture]
        module = importlib.import_module(f"{__name__}.{module_name}")
        return getattr(module, class_name), architecture


ModelRegistry = _ModelRegistry()
