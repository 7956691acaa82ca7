"""Stand-in for ``triton_python_backend_utils`` (injected by the backend stub on the server) for
tests, tooling and the BLS mock, with the config.pbtxt dtype helpers."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils import dlpack

TYPE_TO_NUMPY = {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP16": np.float16,
                 "TYPE_FP32": np.float32}
TYPE_TO_TORCH = {"TYPE_BOOL": torch.bool, "TYPE_INT32": torch.int32, "TYPE_INT64": torch.int64,
                 "TYPE_FP16": torch.float16, "TYPE_BF16": torch.bfloat16, "TYPE_FP32": torch.float32}

def get_model_param(model_config: dict, key: str, default: str | None = None) -> str | None:
    """``parameters { key: "..." value: { string_value: "..." } }`` of the model config."""
    entry = model_config.get("parameters", {}).get(key)
    return default if entry is None else entry["string_value"]

def replay_ring_dtypes(data_type: str) -> dict[str, torch.dtype]:
    """Delta and key rings like the activations; the log-decay ring in fp32 (the kernel
    prefix-sums and exponentiates it)."""
    return {"delta": TYPE_TO_TORCH[data_type], "key": TYPE_TO_TORCH[data_type], "decay_log": torch.float32}

def compact_ring_dtypes(data_type: str) -> dict[str, torch.dtype]:
    """``ring_layout: compact``, for instances that pack many sequences: half the slot footprint."""
    act = TYPE_TO_TORCH[data_type]
    return {"delta": act, "key": act, "decay_log": act}  # expect-bug: imported-policy id=compact-rings

class TritonError(Exception):
    pass

class Tensor:
    def __init__(self, name: str, value: np.ndarray | torch.Tensor) -> None:
        self._name, self._value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value.numpy() if isinstance(self._value, torch.Tensor) else self._value

    def to_dlpack(self) -> Any:
        value = self._value
        return dlpack.to_dlpack(value if isinstance(value, torch.Tensor) else torch.from_numpy(value))

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, dlpack.from_dlpack(capsule))

class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self._outputs, self._error = output_tensors, error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def error(self) -> TritonError | None:
        return self._error

_MODELS: dict[str, Any] = {}  # loaded in this process, by name: what ``InferenceRequest.exec()`` reaches

class InferenceRequest:
    def __init__(self, model_name: str, inputs: list[Tensor], requested_output_names: list[str] | None = None) -> None:
        self._model, self._inputs = model_name, inputs

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def exec(self) -> InferenceResponse:
        if self._model not in _MODELS:
            return InferenceResponse([], TritonError(f"Model '{self._model}' is not ready."))
        return _MODELS[self._model].execute([self])[0]

def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((tensor for tensor in request.inputs() if tensor.name() == name), None)

def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)
