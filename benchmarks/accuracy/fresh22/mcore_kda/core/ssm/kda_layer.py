"""A KDA layer: pre-norm, mixer, residual (cf. megatron/core/ssm/mamba_layer.py)."""

from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from ..transformer.module import MegatronModule
from ..transformer.spec_utils import ModuleSpec, build_module
from ..transformer.transformer_config import TransformerConfig


class IdentityOp(torch.nn.Module):
    def forward(self, x, *args, **kwargs):
        return x


class RMSNorm(torch.nn.Module):
    """Root mean square norm; statistics in fp32, output in the input dtype."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        normed = (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)
        return normed * self.weight


@dataclass
class KDALayerSubmodules:
    """Submodules of a KDA layer."""

    norm: Union[ModuleSpec, type] = IdentityOp
    mixer: Union[ModuleSpec, type] = IdentityOp
    kda_bda: Union[ModuleSpec, type] = IdentityOp


class KDALayer(MegatronModule):
    """A single KDA layer: hidden_states + mixer(norm(hidden_states)), in [s, b, h] layout."""

    def __init__(
        self,
        config: TransformerConfig,
        submodules: KDALayerSubmodules,
        layer_number: int = 1,
        residual_in_fp32: bool = False,
    ):
        super().__init__(config)
        self.config = config
        self.layer_number = layer_number
        self.residual_in_fp32 = residual_in_fp32
        self.norm = build_module(submodules.norm, config, config.hidden_size, eps=config.layernorm_epsilon)
        self.mixer = build_module(submodules.mixer, config, layer_number=layer_number)

    def forward(self, hidden_states: torch.Tensor, inference_context=None) -> torch.Tensor:
        residual = hidden_states
        if self.residual_in_fp32:
            residual = residual.to(torch.float32)
        hidden_states = self.norm(hidden_states)
        hidden_states = self.mixer(hidden_states, inference_context=inference_context)
        output = residual + hidden_states
        return output.to(dtype=hidden_states.dtype)
