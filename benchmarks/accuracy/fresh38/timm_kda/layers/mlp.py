""" MLP module w/ dropout and configurable activation layer
"""
from torch import nn as nn

from .create_act import get_act_layer


class SwiGLU(nn.Module):
    """ SwiGLU (fused gate / up projection), the KDA block default """

    def __init__(
            self,
            in_features,
            hidden_features=None,
            out_features=None,
            act_layer='silu',
            bias=False,
            drop=0.,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, 2 * hidden_features, bias=bias, **dd)
        self.act = get_act_layer(act_layer)()
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias, **dd)

    def forward(self, x):
        x_gate, x = self.fc1(x).chunk(2, dim=-1)
        x = self.act(x_gate) * x
        return self.fc2(self.drop(x))


