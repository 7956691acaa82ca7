import math
from typing import Callable, Optional, Sequence

import torch
import torch.utils.checkpoint
from torch import nn as nn

__all__ = ['named_apply', 'adapt_input_conv', 'checkpoint_seq', 'cast_model_dtype']

# buffers kept in float32 whatever the model dtype (the ReplaySSM kernel accumulates into them)
FP32_BUFFERS = ('ssm_state', 'decay_log_ring')


def named_apply(
        fn: Callable,
        module: nn.Module, name='',
        depth_first: bool = True,
        include_root: bool = False,
) -> nn.Module:
    if not depth_first and include_root:
        fn(module=module, name=name)
    for child_name, child_module in module.named_children():
        child_name = '.'.join((name, child_name)) if name else child_name
        named_apply(fn=fn, module=child_module, name=child_name, depth_first=depth_first, include_root=True)
    if depth_first and include_root:
        fn(module=module, name=name)
    return module


def adapt_input_conv(in_chans: int, conv_weight: torch.Tensor) -> torch.Tensor:
    conv_type = conv_weight.dtype
    conv_weight = conv_weight.float()  # Some weights are in torch.half, ensure it's float for sum on CPU
    O, I, J, K = conv_weight.shape
    if in_chans == 1:
        if I > 3:
            assert conv_weight.shape[1] % 3 == 0
            # For models with space2depth stems
            conv_weight = conv_weight.reshape(O, I // 3, 3, J, K)
            conv_weight = conv_weight.sum(dim=2, keepdim=False)
        else:
            conv_weight = conv_weight.sum(dim=1, keepdim=True)
    elif in_chans != 3:
        if I != 3:
            raise NotImplementedError('Weight format not supported by conversion.')
        else:
            # NOTE this strategy should be better than random init, but there could be other combinations of
            # the original RGB input layer weights that'd work better for specific cases.
            repeat = int(math.ceil(in_chans / 3))
            conv_weight = conv_weight.repeat(1, repeat, 1, 1)[:, :in_chans, :, :]
            conv_weight *= (3 / float(in_chans))
    conv_weight = conv_weight.to(conv_type)
    return conv_weight


def checkpoint_seq(functions, x, every: int = 1, preserve_rng_state: bool = True):
    """ Activation checkpointing over a sequence of modules, ``every`` modules per segment. """
    functions = tuple(functions.children()) if isinstance(functions, nn.Sequential) else tuple(functions)

    def run_function(start, end):
        def forward(_x):
            for j in range(start, end + 1):
                _x = functions[j](_x)
            return _x
        return forward

    for start in range(0, len(functions), every):
        end = min(start + every - 1, len(functions) - 1)
        x = torch.utils.checkpoint.checkpoint(run_function(start, end), x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
    return x


def cast_model_dtype(
        model: nn.Module,
        dtype: torch.dtype,
        device: Optional[torch.device] = None,
        keep_float32: Sequence[str] = FP32_BUFFERS,
) -> nn.Module:
    """ ``model.to(device, dtype)`` that leaves the float32 cache buffers in float32.

    The kept buffers are moved to ``device`` but never narrowed.
    """
    kept = []
    for module in model.modules():
        for name in keep_float32:
            buf = module._buffers.get(name)
            if buf is not None:
                kept.append((module, name, buf))
    model.to(device=device, dtype=dtype)
    for module, name, buf in kept:
        module._buffers[name] = buf.to(device=device) if device is not None else buf
    return model
