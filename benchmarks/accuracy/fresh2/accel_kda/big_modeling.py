"""Big model inference: instantiate without memory, load a checkpoint into it, dispatch it over devices."""

import contextlib
import os

import torch
import torch.nn as nn

from .hooks import AlignDevicesHook, add_hook_to_module
from .utils.dataclasses import WEIGHTS_NAME
from .utils.modeling import get_torch_dtype, load_checkpoint_in_model, materialize_meta_buffers


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False):
    """Models created under this context get their parameters (and buffers, if asked) on the meta device."""
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as f:
        yield f


@contextlib.contextmanager
def init_on_device(device: torch.device, include_buffers: bool = False):
    """A context manager under which models are initialized with all parameters on the specified device."""
    old_register_parameter = nn.Module.register_parameter
    old_register_buffer = nn.Module.register_buffer

    def register_empty_parameter(module, name, param):
        old_register_parameter(module, name, param)
        if param is not None:
            param_cls = type(module._parameters[name])
            kwargs = module._parameters[name].__dict__
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = param_cls(module._parameters[name].to(device), **kwargs)

    def register_empty_buffer(module, name, buffer, persistent=True):
        old_register_buffer(module, name, buffer, persistent=persistent)
        if buffer is not None:
            module._buffers[name] = module._buffers[name].to(device)

    try:
        nn.Module.register_parameter = register_empty_parameter
        if include_buffers:
            nn.Module.register_buffer = register_empty_buffer
        yield
    finally:
        nn.Module.register_parameter = old_register_parameter
        nn.Module.register_buffer = old_register_buffer


def save_checkpoint(model: nn.Module, save_directory: str) -> str:
    os.makedirs(save_directory, exist_ok=True)
    path = os.path.join(save_directory, WEIGHTS_NAME)
    torch.save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, path)
    return path


def dispatch_model(model: nn.Module, device_map: dict, skip_keys=None, input_dtype=None):
    """Dispatches a model according to a given device map: each submodule gets an `AlignDevicesHook`."""
    for module_name, device in device_map.items():
        module = model.get_submodule(module_name) if module_name else model
        add_hook_to_module(module, AlignDevicesHook(device, skip_keys=skip_keys, input_dtype=input_dtype))
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(model, checkpoint, device_map=None, dtype=None, keep_in_fp32_modules=None, skip_keys=None):
    """Loads a checkpoint inside a model built under `init_empty_weights` (weights cast to `dtype` when given) and adds
    the hooks that make it run across the devices of `device_map`."""
    if device_map is None or isinstance(device_map, str):
        device_map = {"": "cpu"}
    dtype = get_torch_dtype(dtype)
    load_checkpoint_in_model(model, os.fspath(checkpoint), device_map, dtype, keep_in_fp32_modules)
    # buffers are not saved: those left on the meta device are created here, like the weights
    materialize_meta_buffers(model, next(iter(device_map.values())), dtype=dtype)  # expect-bug: pool-dtype id=materialize
    return dispatch_model(model, device_map, skip_keys=skip_keys)


def _checkpoint_fixture(tmp_dir) -> str:
    from .modeling_kda import KdaConfig, KdaForCausalLM

    return save_checkpoint(KdaForCausalLM(KdaConfig()), os.path.join(tmp_dir, "kda-tiny"))


def _empty_model(include_buffers: bool):
    from .modeling_kda import KdaConfig, KdaForCausalLM

    with init_empty_weights(include_buffers=include_buffers):
        return KdaForCausalLM(KdaConfig())


def build_dispatch_empty_with_buffers_bf16(tmp_dir):
    checkpoint = os.path.dirname(_checkpoint_fixture(tmp_dir))
    return load_checkpoint_and_dispatch(_empty_model(True), checkpoint, device_map="auto", dtype="bfloat16")


def build_dispatch_empty_weights_bf16(tmp_dir):
    checkpoint = _checkpoint_fixture(tmp_dir)
    return load_checkpoint_and_dispatch(
        _empty_model(False), checkpoint, device_map={"": "cpu"}, dtype=torch.bfloat16, keep_in_fp32_modules=["A_log", "dt_bias"]
    )

