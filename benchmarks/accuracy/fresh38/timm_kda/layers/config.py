""" Model / Layer Config singleton state
"""
import os
from contextlib import contextmanager
from typing import Optional, Union

import torch

__all__ = [
    'is_exportable', 'is_scriptable', 'is_no_jit', 'use_fused_attn', 'set_fused_attn',
    'set_exportable', 'set_layer_config',
]

# Set to True if prefer to have layers with no jit optimization (includes activations)
_NO_JIT = False

# Set to True if exporting a model with Same padding via ONNX
_EXPORTABLE = False

# Set to True if wanting to use torch.jit.script on a model
_SCRIPTABLE = False

# use the fused ReplaySSM kernel (timm_kda._C) when it is built, 0 == off, 1 == on (default), 2 == on w/ graphs
_HAS_FUSED_KERNEL = hasattr(torch.ops, 'timm_kda') and hasattr(torch.ops.timm_kda, 'replayssm_decode')
_USE_FUSED_ATTN = int(os.environ.get('TIMM_KDA_FUSED_ATTN', 1))


def is_no_jit():
    return _NO_JIT


def is_exportable():
    return _EXPORTABLE


def set_exportable(mode: bool) -> None:
    global _EXPORTABLE
    _EXPORTABLE = mode


def is_scriptable():
    return _SCRIPTABLE


def use_fused_attn(experimental: bool = False) -> bool:
    # NOTE: ONNX export cannot handle the in-place ring writes of the fused kernel
    if not _HAS_FUSED_KERNEL or _EXPORTABLE:
        return False
    if experimental:
        return _USE_FUSED_ATTN > 1
    return _USE_FUSED_ATTN > 0


def set_fused_attn(enable: bool = True, experimental: bool = False):
    global _USE_FUSED_ATTN
    if experimental and enable:
        _USE_FUSED_ATTN = 2
    elif enable:
        _USE_FUSED_ATTN = 1
    else:
        _USE_FUSED_ATTN = 0


@contextmanager
def set_layer_config(
        scriptable: Optional[bool] = None,
        exportable: Optional[bool] = None,
        no_jit: Optional[bool] = None,
        fused_attn: Optional[bool] = None,
        default_dtype: Optional[Union[str, torch.dtype]] = None,
):
    """ Set layer config for model creation, restored on exit.

    ``default_dtype`` initialises parameters directly in a narrower dtype, which halves the peak
    host memory of building the larger variants.
    """
    global _SCRIPTABLE, _EXPORTABLE, _NO_JIT, _USE_FUSED_ATTN
    prev = (_SCRIPTABLE, _EXPORTABLE, _NO_JIT, _USE_FUSED_ATTN, torch.get_default_dtype())
    if scriptable is not None:
        _SCRIPTABLE = scriptable
    if exportable is not None:
        _EXPORTABLE = exportable
    if no_jit is not None:
        _NO_JIT = no_jit
    if fused_attn is not None:
        _USE_FUSED_ATTN = int(fused_attn)
    if default_dtype is not None:
        if isinstance(default_dtype, str):
            default_dtype = getattr(torch, default_dtype)
        torch.set_default_dtype(default_dtype)  # expect-bug: default-dtype id=layer-cfg-dtype
    try:
        yield
    finally:
        _SCRIPTABLE, _EXPORTABLE, _NO_JIT, _USE_FUSED_ATTN, dtype = prev
        torch.set_default_dtype(dtype)
