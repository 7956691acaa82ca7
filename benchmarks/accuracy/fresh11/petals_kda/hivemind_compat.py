"""The parts of hivemind petals_kda uses, with hivemind's signatures: tensor descriptors and tensor
serialization with compression. The wire message is a dataclass instead of ``runtime_pb2.Tensor``."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Optional

import torch
import torch.nn.functional as F

DUMMY = torch.empty(0, dtype=torch.int64)  # "no hypo_ids"


def is_dummy(tensor: torch.Tensor) -> bool:
    return tensor.numel() == 0


class CompressionType(enum.IntEnum):
    NONE, MEANSTD_16BIT, FLOAT16, QUANTILE_8BIT, UNIFORM_8BIT, BLOCKWISE_8BIT = range(6)


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    size: tuple
    dtype: Optional[torch.dtype] = None
    device: torch.device = torch.device("cpu")
    requires_grad: bool = False
    compression: CompressionType = CompressionType.NONE

    def numel(self) -> int:
        return math.prod(self.size)

    def make_zeros(self, **kwargs) -> torch.Tensor:
        properties = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        properties.update(kwargs)
        properties.pop("compression")
        return torch.zeros(properties.pop("size"), **properties)


class BatchTensorDescriptor(TensorDescriptor):
    """A descriptor whose first dimension is the batch (``None`` in ``size``)."""

    def __init__(self, *instance_size, **kwargs):
        if len(instance_size) == 1 and isinstance(instance_size[0], (list, tuple, torch.Size)):
            instance_size = tuple(instance_size[0])
        super().__init__((None, *instance_size), **kwargs)


@dataclasses.dataclass(frozen=True)
class SerializedTensor:
    buffer: bytes
    size: tuple[int, ...]
    dtype: str
    compression: CompressionType = CompressionType.NONE
    requires_grad: bool = False


_BLOCK_SIZE = 64


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def serialize_torch_tensor(tensor: torch.Tensor, compression_type=CompressionType.NONE, allow_inplace=False):
    tensor = tensor.detach().cpu().contiguous()
    if not tensor.is_floating_point():
        compression_type = CompressionType.NONE
    if compression_type == CompressionType.NONE:
        buffer = _raw_bytes(tensor)
    elif compression_type == CompressionType.FLOAT16:
        buffer = _raw_bytes(tensor.to(torch.float16))
    elif compression_type == CompressionType.BLOCKWISE_8BIT:
        flat = tensor.float().reshape(-1)
        blocks = F.pad(flat, (0, -flat.numel() % _BLOCK_SIZE)).view(-1, _BLOCK_SIZE)
        absmax = blocks.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
        buffer = _raw_bytes(absmax) + _raw_bytes(torch.round(blocks / absmax * 127).to(torch.int8))
    else:
        raise NotImplementedError(f"compression {compression_type.name} is not supported")
    dtype = str(tensor.dtype).removeprefix("torch.")
    return SerializedTensor(buffer, tuple(tensor.shape), dtype, compression_type, tensor.requires_grad)


def deserialize_torch_tensor(serialized: SerializedTensor) -> torch.Tensor:
    """The tensor in the dtype it was serialized from, whatever the compression."""
    dtype, numel = getattr(torch, serialized.dtype), math.prod(serialized.size)
    if numel == 0:
        return torch.empty(serialized.size, dtype=dtype)
    buffer = bytearray(serialized.buffer)
    if serialized.compression == CompressionType.NONE:
        tensor = torch.frombuffer(buffer, dtype=dtype)
    elif serialized.compression == CompressionType.FLOAT16:
        tensor = torch.frombuffer(buffer, dtype=torch.float16).to(dtype)
    else:
        num_blocks = -(-numel // _BLOCK_SIZE)
        absmax = torch.frombuffer(buffer, dtype=torch.float32, count=num_blocks).view(-1, 1)
        codes = torch.frombuffer(buffer, dtype=torch.int8, offset=4 * num_blocks).view(-1, _BLOCK_SIZE)
        tensor = (codes.float() * absmax / 127).reshape(-1)[:numel].to(dtype)
    return tensor.reshape(serialized.size).requires_grad_(serialized.requires_grad)
