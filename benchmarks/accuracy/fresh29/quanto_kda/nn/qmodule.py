"""QModuleMixin and QLinear: the modules ``quantize()`` puts in place of ``nn.Linear``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..tensor import QTensor, qtype, quantize, to_qtype


class QModuleMixin:
    """Weight and activation quantization for a module with a ``weight`` parameter."""

    def init_qmodule(self, weights: qtype | str | None = None, activations: qtype | str | None = None) -> None:
        self.weight_qtype = to_qtype(weights)
        self.activation_qtype = to_qtype(activations)
        self.calibrating = False
        self.frozen = False
        # per-tensor activation scale, float32 whatever the module's dtype
        self.register_buffer("input_scale", torch.ones((), dtype=torch.float32))

    def qweight(self) -> QTensor:
        return quantize(self.weight, self.weight_qtype)

    def freeze(self) -> None:
        """Replace the float weight by its codes and scale (buffers, so they are saved)."""
        if self.weight_qtype is None or self.frozen:
            return
        qw = self.qweight()
        del self.weight
        self.register_buffer("weight_data", qw.data)
        self.register_buffer("weight_scale", qw.scale)
        if qw.zero_point is not None:
            self.register_buffer("weight_zero_point", qw.zero_point)
        self.frozen = True

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        if not self.frozen:
            return self.weight.to(dtype) if self.weight_qtype is None else self.qweight().dequantize(dtype)
        zero_point = getattr(self, "weight_zero_point", None)
        return QTensor(self.weight_qtype, self.weight_data, self.weight_scale, zero_point).dequantize(dtype)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_qtype is None or self.calibrating:
            return x
        q = self.activation_qtype
        codes = torch.round(x.to(torch.float32) / self.input_scale.float()).clamp(q.qmin, q.qmax)
        return (codes.to(q.dtype).to(torch.float32) * self.input_scale.float()).to(x.dtype)


class QLinear(QModuleMixin, nn.Linear):
    @classmethod
    def from_module(cls, module: nn.Linear, weights=None, activations=None) -> QLinear:
        weight = module.weight
        qmodule = cls(module.in_features, module.out_features, module.bias is not None, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            qmodule.weight.copy_(weight)
            if module.bias is not None:
                qmodule.bias.copy_(module.bias)
        qmodule.init_qmodule(weights, activations)
        return qmodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(self.quantize_input(x), self.dequantized_weight(x.dtype), bias)
