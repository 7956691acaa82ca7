"""Precision plugins (after ``lightning.fabric.plugins.precision``).

``precision=`` of the Trainer and of Fabric is one of the strings below. ``"bf16-true"`` and
``"16-true"`` convert the whole module to the half dtype at setup and create tensors in it while
a model is being built (the default dtype is switched); ``"16-mixed"`` and ``"bf16-mixed"`` keep
float32 weights and run the forward under autocast.
"""

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, Literal

import torch
from torch import nn

_PRECISION_INPUT = Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
_PRECISION_INPUT_STR_ALIAS = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "half": "16-true"}


def apply_to_collection(data: Any, dtype: type, function: Callable, *args: Any) -> Any:
    """Applies ``function`` to every ``dtype`` element of a nested dict/list/tuple."""
    if isinstance(data, dtype):
        return function(data, *args)
    if isinstance(data, dict):
        return {key: apply_to_collection(value, dtype, function, *args) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_collection(value, dtype, function, *args) for value in data)
    return data


def _convert_fp_tensor(tensor: torch.Tensor, dst_type: torch.dtype) -> torch.Tensor:
    return tensor.to(dst_type) if torch.is_floating_point(tensor) else tensor


class _DtypeContextManager:
    """Makes ``dtype`` torch's default dtype while the context is active."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._previous_dtype = torch.get_default_dtype()
        self._new_dtype = dtype

    def __enter__(self) -> None:
        torch.set_default_dtype(self._new_dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self._previous_dtype)


class Precision:
    """Full float32 precision (``"32-true"``); the base class of the other plugins."""

    precision: str = "32-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module

    def tensor_init_context(self) -> ContextManager:
        return nullcontext()

    def module_init_context(self) -> ContextManager:
        return nullcontext()

    def forward_context(self) -> ContextManager:
        return nullcontext()

    def convert_input(self, data: Any) -> Any:
        return data

    def convert_output(self, data: Any) -> Any:
        return data

    def state_dict(self) -> Dict[str, Any]:
        return {}


class HalfPrecision(Precision):
    """``"16-true"``/``"bf16-true"``: parameters, buffers and inputs in the half dtype."""

    def __init__(self, precision: str = "16-true") -> None:
        self.precision = precision
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float16

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_input_dtype)  # expect-bug: module-cast id=fabric-setup

    def tensor_init_context(self) -> ContextManager:
        return _DtypeContextManager(self._desired_input_dtype)

    def module_init_context(self) -> ContextManager:
        return self.tensor_init_context()

    def forward_context(self) -> ContextManager:
        return self.tensor_init_context()

    def convert_input(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _convert_fp_tensor, self._desired_input_dtype)

    def convert_output(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _convert_fp_tensor, torch.get_default_dtype())


class MixedPrecision(Precision):
    """``"16-mixed"``/``"bf16-mixed"``: float32 weights, the forward under autocast."""

    def __init__(self, precision: str = "16-mixed", device: str = "cpu") -> None:
        self.precision = precision
        self.device = device
        self.dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16

    def forward_context(self) -> ContextManager:
        return torch.autocast(self.device, dtype=self.dtype)

    def convert_output(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _convert_fp_tensor, torch.get_default_dtype())

    def state_dict(self) -> Dict[str, Any]:
        return {"autocast_dtype": str(self.dtype)}


def _normalize_precision(precision: Any) -> str:
    precision = str(precision)
    precision = _PRECISION_INPUT_STR_ALIAS.get(precision, precision)
    if precision not in ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"):
        raise ValueError(f"precision={precision!r} is not supported")
    return precision


def _select_precision(precision: Any) -> Precision:
    precision = _normalize_precision(precision)
    if precision.endswith("-true") and precision != "32-true":
        return HalfPrecision(precision)
    if precision.endswith("-mixed"):
        return MixedPrecision(precision)
    return Precision()
