"""The platform the engine runs on (vllm/platforms)."""

from __future__ import annotations

import enum

import torch


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    CPU = enum.auto()


class Platform:
    _enum: PlatformEnum
    device_name: str
    device_type: str
    dispatch_key: str = "CPU"
    supported_dtypes: list[torch.dtype] = [torch.bfloat16, torch.float16, torch.float32]

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def get_device_capability(cls, device_id: int = 0):
        return None

    @classmethod
    def seed_everything(cls, seed: int) -> None:
        torch.manual_seed(seed)


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"

    @classmethod
    def get_device_capability(cls, device_id: int = 0):
        return torch.cuda.get_device_capability(device_id)


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # pinning needs a CUDA context; a CPU-only build cannot pin
        return torch.cuda.is_available()


current_platform: Platform = CudaPlatform() if torch.cuda.is_available() else CpuPlatform()

__all__ = ["Platform", "PlatformEnum", "current_platform"]
