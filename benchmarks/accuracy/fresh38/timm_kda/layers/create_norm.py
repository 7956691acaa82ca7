""" Norm Layer Factory
"""
import functools
import numbers
import types
from typing import Type, Union

import torch
import torch.nn as nn


class RmsNorm(nn.Module):
    """ RmsNorm w/ fp32 statistics """

    def __init__(self, channels, eps=1e-6, affine=True, device=None, dtype=None):
        super().__init__()
        normalized_shape = channels
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = affine
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter('weight', None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            xf = xf * self.weight.float()
        return xf.to(x.dtype)


_NORM_MAP = dict(
    layernorm=nn.LayerNorm,
    rmsnorm=RmsNorm,
)


def get_norm_layer(norm_layer: Union[Type[nn.Module], str, None]):
    if norm_layer is None:
        return None
    assert isinstance(norm_layer, (type, str, types.FunctionType, functools.partial))
    norm_kwargs = {}

    # unbind partial fn, so args can be rebound later
    if isinstance(norm_layer, functools.partial):
        norm_kwargs.update(norm_layer.keywords)
        norm_layer = norm_layer.func

    if isinstance(norm_layer, str):
        if not norm_layer:
            return None
        layer_name = norm_layer.replace('_', '').lower()
        norm_layer = _NORM_MAP[layer_name]

    if norm_kwargs:
        norm_layer = functools.partial(norm_layer, **norm_kwargs)  # bind/rebind args
    return norm_layer
