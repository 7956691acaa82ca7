"""``quantize``, ``freeze``, ``quantization_map`` and ``requantize`` (the optimum-quanto API)."""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from .model import FP32GateLayerCache, KDAConfig, KDAModel
from .nn import QLinear, QModuleMixin
from .tensor import qint8, to_qtype


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def quantize(model: nn.Module, weights=None, activations=None, exclude: str | list[str] | None = None) -> None:
    """Replace every ``nn.Linear`` not matched by ``exclude`` with a ``QLinear`` (in place)."""
    patterns = [exclude] if isinstance(exclude, str) else list(exclude or ())
    weights, activations = to_qtype(weights), to_qtype(activations)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or isinstance(module, QModuleMixin):
            continue
        if any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
            continue
        _set_module(model, name, QLinear.from_module(module, weights, activations))


def freeze(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Freeze the quantized weights; with ``dtype``, move the float part of the model to it."""
    for module in model.modules():
        if isinstance(module, QModuleMixin):
            module.freeze()
    if dtype is not None:
        model.to(dtype)  # expect-bug: module-cast
    return model


def quantization_map(model: nn.Module) -> dict[str, dict[str, str]]:
    qmap = {}
    for name, module in model.named_modules():
        if isinstance(module, QModuleMixin):
            qmap[name] = {key: getattr(q, "name", "none") for key, q in (("weights", module.weight_qtype), ("activations", module.activation_qtype))}
    return qmap


def requantize(model: nn.Module, state_dict: dict[str, torch.Tensor], quantization_map: dict[str, dict[str, str]], device: str | None = None) -> nn.Module:
    """Rebuild the quantized modules of ``quantization_map`` and load ``state_dict`` into them."""
    for name, qconfig in quantization_map.items():
        weights, activations = (None if qconfig[key] == "none" else qconfig[key] for key in ("weights", "activations"))
        qmodule = QLinear.from_module(model.get_submodule(name), weights, activations)
        qmodule.freeze()
        _set_module(model, name, qmodule)
    # assign: keep the loaded storage instead of copying a large checkpoint a second time
    model.load_state_dict(state_dict, strict=False, assign=True)  # expect-bug: load id=half-ckpt
    if device is not None:
        model.to(device=device)
    return model


def _frozen_model(**cache_kwargs) -> KDAModel:
    model = KDAModel(KDAConfig())
    model.setup_caches(slots=2, **cache_kwargs)
    quantize(model, weights=qint8, exclude="*.o_proj")
    freeze(model, dtype=torch.bfloat16)
    model.step(torch.tensor([[3], [5]]), torch.arange(2))
    return model

def build_frozen_bf16():
    return _frozen_model()

def build_frozen_bf16_fp32_gate():
    return _frozen_model(cache_cls=FP32GateLayerCache)
