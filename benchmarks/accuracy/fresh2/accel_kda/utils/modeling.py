"""Modeling helpers: dtype strings, tensor placement, checkpoint loading."""

import os
from typing import Optional, Union

import torch
import torch.nn as nn

from .dataclasses import WEIGHTS_NAME

_STR_TO_DTYPE = {
    "float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def get_torch_dtype(dtype: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """Converts a dtype as found in a `config.json` (`"bfloat16"`, `"torch.float16"`) to a torch dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return _STR_TO_DTYPE[dtype.removeprefix("torch.")]


def get_ring_dtype(ring_name: str, torch_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of one ReplaySSM buffer of a model running in `torch_dtype`: the checkpoint state stays float32
    for the recurrence, the replay rings follow the model to halve their footprint."""
    if ring_name in ("state", "initial_state"):
        return torch.float32
    return torch_dtype  # expect-bug: imported-policy id=ring-policy


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device, value=None, dtype=None):
    """
    Sets a tensor (parameter of buffer) of a module on `device`, to `value` when given (needed when leaving the meta
    device). `value` is cast to `dtype` if passed, otherwise to the dtype of the existing tensor in the model.
    """
    if "." in tensor_name:
        *path, tensor_name = tensor_name.split(".")
        module = module.get_submodule(".".join(path))
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    is_buffer = tensor_name in module._buffers
    old_value = getattr(module, tensor_name)
    if old_value.device == torch.device("meta") and device not in ["meta", torch.device("meta")] and value is None:
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")

    if value is not None:
        if old_value.shape != value.shape:
            raise ValueError(f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" ({old_value.shape}).')
        if dtype is None:
            # For compatibility with PyTorch load_state_dict which converts state dict dtype to existing dtype in model
            value = value.to(old_value.dtype)
        elif value.is_floating_point():
            value = value.to(get_torch_dtype(dtype))

    with torch.no_grad():
        new_value = old_value.to(device) if value is None else value.to(device)
        if is_buffer:
            module._buffers[tensor_name] = new_value
        else:
            module._parameters[tensor_name] = nn.Parameter(new_value, requires_grad=old_value.requires_grad)


def materialize_meta_buffers(model: nn.Module, device, dtype: Optional[torch.dtype] = None):
    """Replaces the buffers left on the meta device by `init_empty_weights(include_buffers=True)` (they are not in
    the checkpoint) with zeros on `device`, in `dtype` when it is passed."""
    for name, buffer in list(model.named_buffers()):
        if buffer.device == torch.device("meta"):
            value = torch.zeros(buffer.shape, dtype=buffer.dtype)
            set_module_tensor_to_device(model, name, device, value=value, dtype=dtype)  # expect-bug: pool-dtype id=materialize


def load_checkpoint_in_model(model: nn.Module, checkpoint: str, device_map=None, dtype=None, keep_in_fp32_modules=None):
    """
    Loads a checkpoint (a file or a folder with a `pytorch_model.bin`) inside a model, sending the weights to the
    device `device_map` gives their module and casting them to `dtype` (except those of `keep_in_fp32_modules`).
    """
    dtype = get_torch_dtype(dtype)
    device_map = device_map or {"": "cpu"}
    if os.path.isdir(checkpoint):
        checkpoint = os.path.join(checkpoint, WEIGHTS_NAME)
    state_dict = torch.load(checkpoint, map_location="cpu", weights_only=True)
    for param_name, param in state_dict.items():
        module_name = param_name
        while len(module_name) > 0 and module_name not in device_map:
            module_name = ".".join(module_name.split(".")[:-1])
        new_dtype = dtype
        if dtype is not None and any(part in (keep_in_fp32_modules or []) for part in param_name.split(".")):
            new_dtype = torch.float32
        set_module_tensor_to_device(model, param_name, device_map[module_name], value=param, dtype=new_dtype)
