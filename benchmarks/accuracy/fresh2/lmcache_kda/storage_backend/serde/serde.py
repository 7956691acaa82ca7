import abc
import io
import json
import struct

import torch

from ...config import LMCacheEngineMetadata
from ...utils import STR_DTYPE_TO_TORCH_DTYPE, TENSOR_FIELDS, TORCH_DTYPE_TO_STR_DTYPE, ReplayStateChunk

MAGIC = b"LMKD"
_HEADER = struct.Struct("<4sHI")  # magic, version, length of the json header


class Serializer(metaclass=abc.ABCMeta):
    @abc.abstractmethod
    def to_bytes(self, chunk: ReplayStateChunk) -> bytes:
        """Serialize a ReplaySSM chunk to bytes."""


class Deserializer(metaclass=abc.ABCMeta):
    def __init__(self, metadata: LMCacheEngineMetadata):
        self.metadata = metadata

    @abc.abstractmethod
    def from_bytes(self, data: bytes) -> ReplayStateChunk:
        """Deserialize a ReplaySSM chunk from bytes."""


class NaiveSerializer(Serializer):
    def to_bytes(self, chunk: ReplayStateChunk) -> bytes:
        with io.BytesIO() as f:
            torch.save({**chunk.tensors(), "write_pos": chunk.write_pos}, f)
            return f.getvalue()


class NaiveDeserializer(Deserializer):
    def from_bytes(self, data: bytes) -> ReplayStateChunk:
        with io.BytesIO(data) as f:
            return ReplayStateChunk(**torch.load(f, weights_only=True))


def pack_tensors(tensors: dict[str, torch.Tensor], **extra) -> bytes:
    """`MAGIC | version | header length | json header | payload`; the header has dtype, shape, offset of each tensor."""
    entries, payload, offset = [], [], 0
    for name, tensor in tensors.items():
        raw = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        entries.append([name, TORCH_DTYPE_TO_STR_DTYPE[tensor.dtype], list(tensor.shape), offset, len(raw)])
        payload.append(raw)
        offset += len(raw)
    header = json.dumps({"tensors": entries, **extra}).encode()
    return _HEADER.pack(MAGIC, 1, len(header)) + header + b"".join(payload)


def unpack_tensors(data: bytes) -> tuple[dict, dict[str, torch.Tensor]]:
    magic, version, header_len = _HEADER.unpack_from(data)
    if magic != MAGIC or version != 1:
        raise ValueError(f"Not an LMCache ReplaySSM chunk (magic={magic!r}, version={version})")
    header = json.loads(data[_HEADER.size : _HEADER.size + header_len])
    body = bytearray(data[_HEADER.size + header_len :])
    tensors = {}
    for name, dtype_name, shape, offset, nbytes in header.pop("tensors"):
        dtype = STR_DTYPE_TO_TORCH_DTYPE[dtype_name]
        tensors[name] = torch.frombuffer(body, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).view(shape)
    return header, tensors


class FastSerializer(Serializer):
    def to_bytes(self, chunk: ReplayStateChunk) -> bytes:
        return pack_tensors(chunk.tensors(), write_pos=chunk.write_pos)


class FastDeserializer(Deserializer):
    def from_bytes(self, data: bytes) -> ReplayStateChunk:
        header, tensors = unpack_tensors(data)
        return ReplayStateChunk(write_pos=header["write_pos"], **tensors)


class CompactGateSerializer(Serializer):
    """Like `FastSerializer`, but ships the log-gate ring as one float32 offset per chunk plus a bfloat16 residual:
    the log-decays of a chunk sit in a narrow band around their mean."""

    def to_bytes(self, chunk: ReplayStateChunk) -> bytes:
        base = chunk.log_gate_ring.float().mean()
        tensors = {f: getattr(chunk, f) for f in TENSOR_FIELDS if f != "log_gate_ring"}
        tensors["gate_residual"] = (chunk.log_gate_ring - base).to(torch.bfloat16)
        return pack_tensors(tensors, write_pos=chunk.write_pos, gate_base=base.item())


class CompactGateDeserializer(Deserializer):
    def from_bytes(self, data: bytes) -> ReplayStateChunk:
        header, tensors = unpack_tensors(data)
        base = torch.tensor(header["gate_base"], dtype=torch.float32)
        log_gate_ring = base + tensors.pop("gate_residual")  # expect-bug: promotion
        return ReplayStateChunk(log_gate_ring=log_gate_ring, write_pos=header["write_pos"], **tensors)
