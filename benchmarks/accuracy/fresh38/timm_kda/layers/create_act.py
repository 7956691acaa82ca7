""" Activation Factory
"""
from typing import Callable, Optional, Type, Union

from torch import nn as nn

from .config import is_exportable, is_scriptable

_ACT_LAYER_DEFAULT = dict(
    silu=nn.SiLU,
    swish=nn.SiLU,
    gelu=nn.GELU,
    gelu_tanh=lambda **kw: nn.GELU(approximate='tanh'),
    relu=nn.ReLU,
    sigmoid=nn.Sigmoid,
    softplus=nn.Softplus,
    tanh=nn.Tanh,
    identity=nn.Identity,
)

LayerType = Union[str, Callable, Type[nn.Module]]


def get_act_layer(name: Union[Type[nn.Module], str] = 'relu'):
    """ Activation Layer Factory """
    if name is None:
        return None
    if not isinstance(name, str):
        # callable, module, etc
        return name
    if not name:
        return None
    if (is_exportable() or is_scriptable()) and name == 'gelu_tanh':
        name = 'gelu'
    return _ACT_LAYER_DEFAULT[name]


def create_act_layer(name: Optional[LayerType], inplace: Optional[bool] = None, **kwargs):
    act_layer = get_act_layer(name)
    if act_layer is None:
        return None
    if inplace is None:
        return act_layer(**kwargs)
    try:
        return act_layer(inplace=inplace, **kwargs)
    except TypeError:
        # recover if act layer doesn't have inplace arg
        return act_layer(**kwargs)
