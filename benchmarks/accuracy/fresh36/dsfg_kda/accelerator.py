"""Accelerator abstraction (``get_accelerator()``), reduced to what the inference engine uses.

Only the CPU accelerator is implemented here; device builds register theirs with
:func:`set_accelerator` before the engine is created.
"""

import abc
import contextlib
from typing import Iterator, Optional

import torch


class DeepSpeedAccelerator(abc.ABC):
    _name: str = "abstract"

    @abc.abstractmethod
    def device_name(self, device_index: Optional[int] = None) -> str:
        ...

    def current_device_name(self) -> str:
        return self.device_name()

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    @abc.abstractmethod
    def is_bf16_supported(self) -> bool:
        ...

    def supports_mixed_dtype_rings(self) -> bool:
        """Whether the ReplaySSM kernel build takes rings of different element types."""
        return True

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class CPU_Accelerator(DeepSpeedAccelerator):
    _name = "cpu"

    def __init__(self, bf16: bool = True, mixed_dtype_rings: bool = True) -> None:
        self._bf16 = bf16
        self._mixed_dtype_rings = mixed_dtype_rings

    def device_name(self, device_index: Optional[int] = None) -> str:
        return "cpu"

    def is_bf16_supported(self) -> bool:
        return self._bf16

    def supports_mixed_dtype_rings(self) -> bool:
        return self._mixed_dtype_rings


_accelerator: Optional[DeepSpeedAccelerator] = None


def get_accelerator() -> DeepSpeedAccelerator:
    global _accelerator
    if _accelerator is None:
        _accelerator = CPU_Accelerator()
    return _accelerator


def set_accelerator(accel_obj: Optional[DeepSpeedAccelerator]) -> None:
    global _accelerator
    _accelerator = accel_obj


@contextlib.contextmanager
def accelerator_override(accel_obj: DeepSpeedAccelerator) -> Iterator[DeepSpeedAccelerator]:
    """Runs a block with ``accel_obj`` as the accelerator (tests and single-process tools)."""
    previous = _accelerator
    set_accelerator(accel_obj)
    try:
        yield accel_obj
    finally:
        set_accelerator(previous)
