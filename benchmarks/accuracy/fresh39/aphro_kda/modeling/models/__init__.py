import importlib
from typing import Dict, Tuple, Type

from torch import nn

_MODELS: Dict[str, Tuple[str, str]] = {
    "KimiLinearForCausalLM": ("kimi_linear", "KimiLinearForCausalLM"),
}


class ModelRegistry:
    @staticmethod
    def load_model_cls(model_arch: str) -> Type[nn.Module]:
        if model_arch not in _MODELS:
            raise ValueError(f"Model architecture {model_arch} is not supported for now.")
        module_name, cls_name = _MODELS[model_arch]
        module = importlib.import_module(f"{__name__}.{module_name}")
        return getattr(module, cls_name)
