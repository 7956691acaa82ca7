"""Hooks that run around a module's forward: device alignment and bound decode steps."""

import functools
import torch
import torch.nn as nn

from .kernels import fused_recurrent_kda_replayssm_decode
from .utils.modeling import set_module_tensor_to_device
from .utils.operations import send_to_device


class ModelHook:
    """Callbacks executed just before and after the forward method of a model (they get the kwargs too)."""

    def init_hook(self, module):
        return module

    def pre_forward(self, module, *args, **kwargs):
        return args, kwargs

    def post_forward(self, module, output):
        return output


def add_hook_to_module(module: nn.Module, hook: ModelHook):
    """Adds a hook to a given module by rewriting its `forward`; `remove_hook_from_module` restores it."""
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        old_forward = module._old_forward
    else:
        old_forward = module.forward
        module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook

    def new_forward(module, *args, **kwargs):
        args, kwargs = module._hf_hook.pre_forward(module, *args, **kwargs)
        return module._hf_hook.post_forward(module, module._old_forward(*args, **kwargs))

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)
    return module


class AlignDevicesHook(ModelHook):
    """Puts the inputs and weights of the module on `execution_device` for its forward; floating point inputs are
    cast to `input_dtype` when given, the kwargs in `skip_keys` (caches) are passed through."""

    def __init__(self, execution_device=None, skip_keys=None, input_dtype=None):
        self.execution_device = execution_device
        self.skip_keys = skip_keys
        self.input_dtype = input_dtype

    def init_hook(self, module):
        for name, _ in [*module.named_parameters(), *module.named_buffers()]:
            set_module_tensor_to_device(module, name, self.execution_device)
        return module

    def pre_forward(self, module, *args, **kwargs):
        return (
            send_to_device(args, self.execution_device, dtype=self.input_dtype),
            send_to_device(kwargs, self.execution_device, dtype=self.input_dtype, skip_keys=self.skip_keys),
        )


class ReplayDecodeHook(ModelHook):
    """Gives a KDA layer ReplaySSM buffers of its own, bound into the decode kernel once so that every step sees the
    same addresses (what CUDA-graph capture needs). `dtype` is the precision of the rows appended at each step."""

    def __init__(self, num_slots: int, ring_len: int, dtype: torch.dtype = torch.float32, device="cpu"):
        self.num_slots, self.ring_len, self.dtype, self.device = num_slots, ring_len, dtype, device

    def init_hook(self, module):
        slots, L = self.num_slots, self.ring_len
        H, HV, K, V = module.num_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim
        self.state = torch.zeros(slots, HV, V, K, dtype=torch.float32, device=self.device)
        self.value_rows = torch.zeros(slots, HV, L, V, dtype=self.dtype, device=self.device)
        self.key_rows = torch.zeros(slots, H, L, K, dtype=self.dtype, device=self.device)
        self.hv_key_rows = torch.zeros(slots, HV, L, K, dtype=self.dtype, device=self.device)  # expect-bug: decode-arg
        self.cursor = torch.zeros(slots, dtype=torch.int32, device=self.device)
        module.decode_fn = functools.partial(
            fused_recurrent_kda_replayssm_decode,
            initial_state=self.state,
            d_cache=self.value_rows,
            k_cache=self.key_rows,
            g_cache=self.hv_key_rows,
            write_pos=self.cursor,
        )
        return module
