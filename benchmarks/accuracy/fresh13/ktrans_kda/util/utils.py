"""Helpers shared by the operators and the optimiser: module surgery, weight loading, dtype
policies for the ReplaySSM rings, ring allocation and cursor arithmetic."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

from ..compat import get_logger
from ..models.configuration_kimi_linear import KimiLinearConfig
from .custom_gguf import GGUFLoader, translate_name_to_gguf

logger = get_logger(__name__)


def get_module(model: nn.Module, key: str) -> nn.Module:
    module = model
    for part in key.split(".") if key else []:
        module = getattr(module, part)
    return module


def set_module(model: nn.Module, submodule_key: str, module: nn.Module) -> None:
    parent_key, _, name = submodule_key.rpartition(".")
    parent = get_module(model, parent_key)
    if isinstance(parent, nn.ModuleList):
        parent[int(name)] = module
    else:
        setattr(parent, name, module)


def get_device(gguf_module_key: str, device_map: dict[str, dict[str, str]]) -> str:
    if gguf_module_key in device_map:
        return device_map[gguf_module_key]["generate_device"]
    return "cpu"


def set_param(module: nn.Module, name: str, weights: torch.Tensor) -> None:
    if name in module._buffers:
        module._buffers[name] = weights
    else:
        module.register_parameter(name, nn.Parameter(weights, requires_grad=False))


def load_cur_state_dict(module: nn.Module, gguf_loader: GGUFLoader, prefix: str = "", device: str = "cpu") -> None:
    """Loads the direct parameters/persistent buffers of ``module``; ``prefix`` is its HF name."""
    persistent = {name for name in module._buffers if name not in module._non_persistent_buffers_set}
    for name in [*module._parameters, *persistent]:
        if getattr(module, name) is None:
            continue
        key = prefix + name
        if gguf_loader.has_tensor(key):
            set_param(module, name, gguf_loader.load_tensor(key, device=device))
        elif getattr(module, name).is_meta:
            raise KeyError(f"can't find {translate_name_to_gguf(key)} in the GGUF archive")


def load_weights(module: nn.Module, gguf_loader: GGUFLoader, prefix: str = "", device: str = "cpu") -> None:
    """Recursively loads ``module``; an injected operator's own ``load`` takes over its subtree."""
    load_cur_state_dict(module, gguf_loader, prefix, device)
    for name, child in module._modules.items():
        if child is None:
            continue
        if hasattr(child, "load") and callable(child.load) and hasattr(child, "orig_module"):
            child.load()
        else:
            load_weights(child, gguf_loader, prefix + name + ".", device)


@contextlib.contextmanager
def torch_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets torch's default floating dtype for the block and restores the previous one after it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def kda_compute_dtype(config: KimiLinearConfig) -> torch.dtype:
    """Activation dtype of the decode step (projections, kernel output)."""
    return config.model_torch_dtype


def kda_cache_dtype(config: KimiLinearConfig, ring: str) -> torch.dtype:
    """dtype that a ReplaySSM ring of kind ``ring`` ("state", "delta", "key", "alpha_log") is kept in."""
    return config.model_torch_dtype  # expect-bug: imported-policy id=cache-dtype-policy


def alloc_ring_set(
    shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Zeroed tensors, one per entry of ``shapes``, all of ``dtype``."""
    return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}


def advance_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Cursor after one step: 0 where the step flushed (last row or forced), else ``pos + 1``."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)


def build_ring_helpers():
    """Rings from the helpers: d/k through ``alloc_ring_set``, the log-decays in float32 beside them."""
    torch.manual_seed(5)
    config = KimiLinearConfig(torch_dtype="float16")
    shapes = config.ring_shapes(2)
    rings = alloc_ring_set(
        {name: shapes[name] for name in ("delta", "key")}, dtype=kda_cache_dtype(config, "delta")
    )
    rings["alpha_log"] = torch.zeros(shapes["alpha_log"], dtype=config.alpha_log_torch_dtype)
    with torch_default_dtype(config.model_torch_dtype):
        rings["state"] = torch.zeros(shapes["state"])
        rings["alpha_log_prefix"] = torch.zeros(shapes["alpha_log"], dtype=torch.float32)
    rings["alpha_log_scratch"] = torch.randn(shapes["alpha_log"]).clamp_max(0.0)
    write_pos = torch.tensor([0, config.replay_ring_len - 1], dtype=torch.int32)
    cursors = [write_pos]
    for step in range(3):
        forced = torch.tensor([int(step == 1), 0], dtype=torch.int32)
        cursors.append(advance_write_pos(cursors[-1], config.replay_ring_len, forced))
    return {"rings": rings, "cursors": cursors}
