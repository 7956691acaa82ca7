"""Kimi-Linear modules as the checkpoint defines them (names follow the HF implementation).

These are the *original* modules: ``optimize_and_load_gguf`` builds them on the meta device and the
optimisation rules swap the attention layers for injected operators before any weight is loaded.
``KimiDeltaAttention.forward`` keeps the plain recurrence as the reference behaviour.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_kimi_linear import KimiLinearConfig


class KimiRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class KimiMLP(nn.Module):
    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention: per-channel gated delta rule over a ``[HV, V, K]`` state."""

    def __init__(self, config: KimiLinearConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        h, hv = config.num_attention_heads, config.num_value_heads
        k, v = config.head_dim, config.v_head_dim
        self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = h, hv, k, v
        self.q_proj = nn.Linear(config.hidden_size, h * k, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, h * k, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, hv * v, bias=False)
        self.f_proj = nn.Linear(config.hidden_size, hv * k, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, hv, bias=False)
        self.o_proj = nn.Linear(hv * v, config.hidden_size, bias=False)
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.dt_bias = nn.Parameter(torch.zeros(hv * k))

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed_qkv, a, b)`` for one decode token per row, in the activation dtype."""
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        mixed_qkv = torch.cat([q, k, v], dim=-1).contiguous()
        return mixed_qkv, self.f_proj(hidden_states).contiguous(), self.b_proj(hidden_states)

    def forward(
        self, hidden_states: torch.Tensor, recurrent_state: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row through the plain recurrence; ``recurrent_state`` is ``[B, HV, V, K]`` fp32."""
        bsz = hidden_states.shape[0]
        h, hv, kd, vd = self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        mixed_qkv, a, b = self.project(hidden_states)
        mixed_qkv = mixed_qkv.float()
        q = F.normalize(mixed_qkv[:, : h * kd].view(bsz, h, kd), dim=-1, eps=1e-6)
        k = F.normalize(mixed_qkv[:, h * kd : 2 * h * kd].view(bsz, h, kd), dim=-1, eps=1e-6)
        v = mixed_qkv[:, 2 * h * kd :].view(bsz, hv, vd)
        heads = torch.arange(hv) // (hv // h)
        q, k = q[:, heads] * kd**-0.5, k[:, heads]
        x = a.float().view(bsz, hv, kd) + self.dt_bias.float().view(hv, kd)
        log_decay = -self.A_log.float().exp()[:, None] * F.softplus(x)
        beta = torch.sigmoid(b.float())
        if recurrent_state is None:
            recurrent_state = torch.zeros(bsz, hv, vd, kd, dtype=torch.float32)
        state = recurrent_state * log_decay.exp()[:, :, None, :]
        delta = beta[..., None] * (v - torch.einsum("bhvk,bhk->bhv", state, k))
        state = state + delta[..., None] * k[:, :, None, :]
        out = torch.einsum("bhvk,bhk->bhv", state, q).to(hidden_states.dtype)
        return self.o_proj(out.reshape(bsz, -1)), state


class KimiDecoderLayer(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = KimiRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = KimiDeltaAttention(config, layer_idx)
        self.post_attention_layernorm = KimiRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = KimiMLP(config)

    def forward(self, hidden_states: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        attn_out = self.self_attn(self.input_layernorm(hidden_states), **attn_kwargs)
        if isinstance(attn_out, tuple):
            attn_out = attn_out[0]
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class KimiLinearModel(nn.Module):
    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KimiDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = KimiRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, **attn_kwargs)
        return self.norm(hidden_states)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.config = config
        self.model = KimiLinearModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        """Logits for one decode token per row; ``attn_kwargs`` reach every attention layer."""
        return self.lm_head(self.model(input_ids, **attn_kwargs)).float()
