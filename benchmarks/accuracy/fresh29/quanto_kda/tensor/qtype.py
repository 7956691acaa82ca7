"""qtypes: how a quantized tensor stores its codes and which range they cover."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class qtype:
    name: str
    is_floating_point: bool
    bits: int
    dtype: torch.dtype  # storage dtype of the codes
    qmin: float
    qmax: float


def _float_qtype(name: str, dtype: torch.dtype) -> qtype:
    info = torch.finfo(dtype)
    return qtype(name, True, info.bits, dtype, float(info.min), float(info.max))


qint4 = qtype("qint4", False, 4, torch.int8, -8.0, 7.0)
qint8 = qtype("qint8", False, 8, torch.int8, -128.0, 127.0)
quint8 = qtype("quint8", False, 8, torch.uint8, 0.0, 255.0)
# e5m2 without float8 dtypes: the codes are the high byte of a float16, kept as raw uint8
qfloat8 = qtype("qfloat8", True, 8, torch.uint8, -57344.0, 57344.0)
qfp16 = _float_qtype("qfp16", torch.float16)
qbf16 = _float_qtype("qbf16", torch.bfloat16)
qfp32 = _float_qtype("qfp32", torch.float32)

qtypes = {q.name: q for q in (qint4, qint8, quint8, qfloat8, qfp16, qbf16, qfp32)}


def to_qtype(value: str | qtype | None) -> qtype | None:
    if value is None or isinstance(value, qtype):
        return value
    return qtypes[value]


# How QuantizedKDACache stores each ReplaySSM ring for a given cache qtype: integer qtypes are
# codes with float32 scales, float qtypes are stored as that dtype.
CACHE_RING_QTYPES = {
    "qint8": {"d": qint8, "k": qint8, "gate": qfp32},
    "quint8": {"d": quint8, "k": quint8, "gate": qfp32},
    "qint4": {"d": qint4, "k": qint4, "gate": qfp32},
    "qfp16": {"d": qfp16, "k": qfp16, "gate": qfp32},
    "qbf16": {"d": qbf16, "k": qbf16, "gate": qbf16},  # expect-bug: imported-policy id=ring-qtypes
}
