"""Layout metadata of a transferred slot, and the packed header that precedes its bytes.

One layer's slot travels as ``header | payload``: the header names every tensor with its dtype
string, shape, offset and size (``struct``-packed, fixed width), the payload holds the raw
tensor bytes at 64-byte aligned offsets so that the receiver can view them in place.
"""

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Tuple, Union

import torch
from torch import Tensor

from ..config import str_to_torch_dtype, torch_dtype_to_str

MAGIC = b"MCK2"
LEGACY_MAGIC = b"MCK1"
ALIGN = 64
SLOT_TENSORS = ("ckpt_state", "delta_ring", "key_ring", "forget_ring", "cursor")

_HEADER = struct.Struct("<4sHHI12s")  # magic, layer, tensor count, tokens, model dtype
_ENTRY = struct.Struct("<24s12sB3xQQ4I")  # name, dtype, ndim, offset, nbytes, dims

Buffer = Union[bytes, bytearray, memoryview]


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class WireFormat:
    """Dtypes a slot's tensors are sent in (``to_wire``)."""

    state: str = "float32"
    delta: str = "bfloat16"
    key: str = "bfloat16"
    forget: str = "float32"

    def dtype_for(self, name: str) -> str:
        by_name = {"ckpt_state": self.state, "delta_ring": self.delta, "key_ring": self.key, "forget_ring": self.forget}
        return by_name.get(name, "int32")


@dataclass(frozen=True)
class HalfWireFormat(WireFormat):
    """fp16 rings, for decode peers whose kernels take no bf16."""

    delta: str = "float16"
    key: str = "float16"
    forget: str = "float16"  # expect-bug: container


def to_wire(tensors: Mapping[str, Tensor], fmt: WireFormat) -> Dict[str, Tensor]:
    return {name: t.to(str_to_torch_dtype(fmt.dtype_for(name))) for name, t in tensors.items()}


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: Tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return str_to_torch_dtype(self.dtype)


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("ascii")


@dataclass
class SlotLayoutMeta:
    layer: int
    n_tokens: int
    entries: List[TensorEntry] = field(default_factory=list)
    model_dtype: str = "bfloat16"

    @property
    def header_size(self) -> int:
        return align(_HEADER.size + len(self.entries) * _ENTRY.size)

    @property
    def total_bytes(self) -> int:
        payload = max((e.offset + e.nbytes for e in self.entries), default=0)
        return self.header_size + align(payload)

    def entry(self, name: str) -> TensorEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    @classmethod
    def describe(cls, layer: int, n_tokens: int, tensors: Mapping[str, Tensor], model_dtype: str) -> "SlotLayoutMeta":
        entries, offset = [], 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            entries.append(TensorEntry(name, torch_dtype_to_str(t.dtype), tuple(t.shape), offset, nbytes))
            offset += align(nbytes)
        return cls(layer, n_tokens, entries, model_dtype)

    def pack(self) -> bytes:
        parts = [_HEADER.pack(MAGIC, self.layer, len(self.entries), self.n_tokens, self.model_dtype.encode())]
        for e in self.entries:
            dims = tuple(e.shape) + (0,) * (4 - len(e.shape))
            parts.append(_ENTRY.pack(e.name.encode(), e.dtype.encode(), len(e.shape), e.offset, e.nbytes, *dims))
        raw = b"".join(parts)
        return raw + bytes(self.header_size - len(raw))

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> "SlotLayoutMeta":
        magic, layer, count, n_tokens, model_dtype = _HEADER.unpack_from(data, offset)
        if magic != MAGIC:
            raise ValueError(f"not a slot header: {bytes(magic)!r}")
        entries = []
        for i in range(count):
            name, dtype, ndim, start, nbytes, *dims = _ENTRY.unpack_from(data, offset + _HEADER.size + i * _ENTRY.size)
            entries.append(TensorEntry(_text(name), _text(dtype), tuple(dims[:ndim]), start, nbytes))
        return cls(layer, n_tokens, entries, _text(model_dtype))


def serialize_slot(meta: SlotLayoutMeta, tensors: Mapping[str, Tensor]) -> bytes:
    out = bytearray(meta.total_bytes)
    out[: meta.header_size] = meta.pack()
    for e in meta.entries:
        start = meta.header_size + e.offset
        out[start : start + e.nbytes] = tensors[e.name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return bytes(out)


def deserialize_slot(blob: Buffer) -> Tuple[SlotLayoutMeta, Dict[str, Tensor]]:
    """The header and views of every tensor over a private copy of ``blob``."""
    data = bytearray(blob)
    meta = SlotLayoutMeta.unpack(data)
    raw = torch.frombuffer(data, dtype=torch.uint8)
    views = {}
    for e in meta.entries:
        start = meta.header_size + e.offset
        views[e.name] = raw[start : start + e.nbytes].view(e.torch_dtype).view(e.shape)
    return meta, views


def build_header_roundtrip() -> Dict[str, object]:
    """A bf16 slot packed as sent (default wire format and fp16 delta/key rings) and unpacked."""
    torch.manual_seed(0)
    tensors = {
        "ckpt_state": torch.randn(4, 8, 8),
        "delta_ring": torch.randn(4, 4, 8).to(torch.bfloat16),
        "key_ring": torch.randn(2, 4, 8).to(torch.bfloat16),
        "forget_ring": -torch.rand(4, 4, 8),
        "cursor": torch.tensor(3, dtype=torch.int32),
    }
    unpacked = {}
    for label, fmt in (("default", WireFormat()), ("fp16", WireFormat(delta="float16", key="float16"))):
        wire = to_wire(tensors, fmt)
        meta = SlotLayoutMeta.describe(0, 3, wire, "bfloat16")
        again, views = deserialize_slot(serialize_slot(meta, wire))
        assert again == meta
        unpacked[label] = {name: view.clone() for name, view in views.items()}
    unpacked["fp16"]["forget_ring"] = unpacked["fp16"]["forget_ring"].to(torch.float32)
    return unpacked
