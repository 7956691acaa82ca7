"""Kernel injection: the HF KDA layers are swapped for containers that own their decode rings."""

import torch
from torch import nn

from .config import DeepSpeedInferenceConfig, DeepSpeedReplayConfig
from .kernels import kda_replayssm_decode
from .modeling import KimiDeltaAttention, KimiLinearConfig, KimiLinearForCausalLM
from .utils import log_dist


class DSKDAContainer(nn.Module):
    """Fused replacement of one ``KimiDeltaAttention`` that owns its ReplaySSM rings (buffers,
    one decode slot per batch row of the v1 engine)."""

    def __init__(
        self, layer: KimiDeltaAttention, replay: DeepSpeedReplayConfig, dtype: torch.dtype
    ) -> None:
        super().__init__()
        weight = torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight])
        self.qkv_w = nn.Parameter(weight.detach().clone())
        self.f_w = nn.Parameter(layer.f_proj.weight.detach().clone())
        self.b_w = nn.Parameter(layer.b_proj.weight.detach().clone())
        self.o_w = nn.Parameter(layer.o_proj.weight.detach().clone())
        self.A_log = nn.Parameter(layer.A_log.detach().clone())
        self.dt_bias = nn.Parameter(layer.dt_bias.detach().clone())
        self.num_heads, self.head_dim = layer.num_heads, layer.head_dim
        self.scale = layer.head_dim**-0.5

        batch, ring_len = replay.max_batch_size, replay.ring_len
        hv, h, dim = layer.num_heads, layer.num_k_heads, layer.head_dim
        self.register_buffer("ssm_state", torch.zeros(batch, hv, dim, dim, dtype=dtype))
        self.register_buffer("delta_cache", torch.zeros(batch, hv, ring_len, dim, dtype=dtype))
        self.register_buffer("key_cache", torch.zeros(batch, h, ring_len, dim, dtype=dtype))
        self.register_buffer("alpha_cache", torch.zeros(batch, hv, ring_len, dim))
        self.register_buffer("write_pos", torch.zeros(batch, dtype=torch.int32))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch = hidden_states.shape[0]
        out = hidden_states.new_zeros(batch, 1, self.num_heads, self.head_dim)
        kda_replayssm_decode(
            hidden_states @ self.qkv_w.t(),
            hidden_states @ self.f_w.t(),
            hidden_states @ self.b_w.t(),
            self.A_log,
            self.dt_bias,
            self.scale,
            self.ssm_state,
            self.delta_cache,
            self.key_cache,
            self.alpha_cache,
            out,
            torch.arange(batch, dtype=torch.int32),
            self.write_pos,
        )
        return out.flatten(1) @ self.o_w.t()


def replace_kda_layers(
    model: KimiLinearForCausalLM, config: DeepSpeedInferenceConfig
) -> KimiLinearForCausalLM:
    """Replaces every KDA layer of ``model`` in place by a ``DSKDAContainer``."""
    replaced = 0
    for layer in model.layers:
        if isinstance(layer.self_attn, KimiDeltaAttention):
            layer.self_attn = DSKDAContainer(layer.self_attn, config.replay, config.dtype)
            replaced += 1
    log_dist(f"replaced {replaced} KDA layers with DeepSpeed containers", ranks=[0])
    return model


def build_container_on_cpu() -> dict[str, torch.Tensor]:
    config = DeepSpeedInferenceConfig(dtype=torch.bfloat16, replace_with_kernel_inject=True)
    model = replace_kda_layers(KimiLinearForCausalLM(KimiLinearConfig()), config)
    model.to("cpu")
    return dict(model.named_buffers())
