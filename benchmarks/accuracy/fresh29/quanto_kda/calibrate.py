"""Calibration of activation scales, and the scratch rings used while calibrating."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .kernels import fused_recurrent_kda_replayssm_decode
from .model import KDAAttention, KDAConfig, KDAModel, ring_shapes
from .nn import QModuleMixin
from .quantize import freeze, quantize
from .tensor import absmax_scale, qint8


class Calibration:
    """Inside the context, ``input_scale`` of each quantized module tracks ``absmax / qmax``."""

    def __init__(self, model: nn.Module, momentum: float = 0.9):
        self.modules = [m for m in model.modules() if isinstance(m, QModuleMixin) and m.activation_qtype is not None]
        self.momentum = momentum
        self.seen: set[int] = set()
        self.handles = []

    def _observe(self, module, args) -> None:
        scale = absmax_scale(args[0], module.activation_qtype).to(module.input_scale.dtype)
        if id(module) in self.seen:
            module.input_scale.mul_(self.momentum).add_(scale * (1.0 - self.momentum))
        else:
            module.input_scale.copy_(scale)
            self.seen.add(id(module))

    def __enter__(self) -> Calibration:
        for module in self.modules:
            module.calibrating = True
            self.handles.append(module.register_forward_pre_hook(self._observe))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        for module in self.modules:
            module.calibrating = False


@torch.no_grad()
def calibrate(model: KDAModel, batches: Iterable[torch.Tensor], momentum: float = 0.9, half: bool = False) -> KDAModel:
    if half:  # calibrate at the precision the model is served in
        model.half()  # expect-bug: module-cast
    with Calibration(model, momentum):
        for input_ids in batches:
            model.prefill(input_ids)
    return model


def calibration_cache(config: KDAConfig, slots: int, dtype: torch.dtype = torch.bfloat16) -> list[dict[str, torch.Tensor]]:
    """Scratch rings for decoding calibration prompts, one dict per layer."""
    shapes = ring_shapes(config, slots)
    caches = []
    for _ in range(config.num_layers):
        d_ring, k_ring, log_decay_q = (torch.zeros(shapes[ring], dtype=dtype) for ring in ("d", "k", "g"))  # expect-bug: pool-dtype
        caches.append({"state": torch.zeros(shapes["state"], dtype=torch.float32), "d_ring": d_ring, "k_ring": k_ring, "log_decay_q": log_decay_q})
    return caches


@torch.no_grad()
def record_decode_trace(layer: KDAAttention, hidden: torch.Tensor, compute_dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """One decode step of ``layer`` over fresh rings, run at ``compute_dtype``."""
    shapes = ring_shapes(layer.config, hidden.shape[0])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(compute_dtype)  # expect-bug: default-dtype id=trace-default
    try:
        trace = {"state": torch.zeros(shapes["state"], dtype=torch.float32), "d_trace": torch.zeros(shapes["d"]), "k_trace": torch.zeros(shapes["k"]), "alpha_log": torch.zeros(shapes["g"])}  # expect-bug: default-dtype id=trace-default
        q, k, v, g, beta = (x[:, -1] for x in layer.project(hidden))
        slots = torch.arange(hidden.shape[0], dtype=torch.int32)
        trace["out"] = fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=layer.gate_step(g), beta=beta, initial_state=trace["state"], initial_state_indices=slots, d_cache=trace["d_trace"], k_cache=trace["k_trace"], g_cache=trace["alpha_log"])
    finally:
        torch.set_default_dtype(previous)
    return trace


def _prompts() -> list[torch.Tensor]:
    return [torch.arange(8).view(2, 4) % 16, (torch.arange(8).view(2, 4) * 3) % 16]

def build_calibrated_int8():
    model = KDAModel(KDAConfig(), dtype=torch.bfloat16)
    quantize(model, weights=qint8, activations=qint8)
    calibrate(model, _prompts())
    freeze(model)
    model.setup_caches(slots=2)
    model.step(torch.tensor([[1], [2]]), torch.arange(2))
    return model

def build_calibration_decode():
    model = KDAModel(KDAConfig(), dtype=torch.bfloat16)
    caches = calibration_cache(model.config, slots=2)
    model.step(torch.tensor([[4], [9]]), torch.arange(2), caches)
    return caches
