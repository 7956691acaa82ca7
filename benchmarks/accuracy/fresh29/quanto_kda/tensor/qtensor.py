"""QTensor: integer (or e5m2) codes with a float32 scale and an optional zero point."""

from __future__ import annotations

import torch

from .qtype import qtype


def pack_e5m2(x: torch.Tensor) -> torch.Tensor:
    """e5m2 codes of ``x`` (truncated): the high byte of each float16, as uint8."""
    bits = x.to(torch.float16).view(torch.int16).to(torch.int32)
    return ((bits >> 8) & 0xFF).to(torch.uint8)


def unpack_e5m2(codes: torch.Tensor) -> torch.Tensor:
    bits = codes.to(torch.int32) << 8
    bits = torch.where(bits >= 32768, bits - 65536, bits)
    return bits.to(torch.int16).view(torch.float16)


class QTensor:
    def __init__(self, qtype: qtype, data: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None):
        self.qtype = qtype
        self.data = data
        self.scale = scale
        self.zero_point = zero_point

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.qtype.is_floating_point and self.qtype.bits == 8:
            x = unpack_e5m2(self.data).to(torch.float32)
        else:
            x = self.data.to(torch.float32)
        if self.zero_point is not None:
            x = x - self.zero_point.to(torch.float32)
        return (x * self.scale).to(dtype)

    def zeros_like(self) -> QTensor:
        zero_point = None if self.zero_point is None else torch.zeros_like(self.zero_point)
        return QTensor(self.qtype, torch.zeros_like(self.data), torch.ones_like(self.scale), zero_point)

    def assign(self, index: torch.Tensor, other: QTensor) -> None:
        self.data[index] = other.data
        self.scale[index] = other.scale
        if self.zero_point is not None:
            self.zero_point[index] = other.zero_point


def absmax_scale(x: torch.Tensor, qtype: qtype, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    amax = x.detach().abs().to(torch.float32)
    amax = amax.amax() if dims is None else amax.amax(dim=dims, keepdim=True)
    return torch.clamp(amax, min=1e-6) / qtype.qmax


def quantize(x: torch.Tensor, qtype: qtype, dims: tuple[int, ...] | None = None) -> QTensor:
    """Per-tensor (``dims=None``) or per-row quantization of ``x``; scales are float32."""
    xf = x.detach().to(torch.float32)
    if qtype.qmin == 0:  # unsigned: affine, with a zero point
        lo = xf.amin() if dims is None else xf.amin(dim=dims, keepdim=True)
        hi = xf.amax() if dims is None else xf.amax(dim=dims, keepdim=True)
        scale = ((hi.clamp(min=0) - lo.clamp(max=0)) / (qtype.qmax - qtype.qmin)).clamp(min=1e-6)
        zero_point = (qtype.qmin - torch.round(lo.clamp(max=0) / scale)).to(torch.int32)
        codes = (torch.round(xf / scale) + zero_point).clamp(qtype.qmin, qtype.qmax)
        return QTensor(qtype, codes.to(qtype.dtype), scale, zero_point)
    scale = absmax_scale(xf, qtype, dims)
    if qtype.is_floating_point:
        codes = pack_e5m2(xf / scale) if qtype.bits == 8 else (xf / scale).to(qtype.dtype)
        return QTensor(qtype, codes, scale)
    codes = torch.round(xf / scale).clamp(qtype.qmin, qtype.qmax)
    return QTensor(qtype, codes.to(qtype.dtype), scale)
