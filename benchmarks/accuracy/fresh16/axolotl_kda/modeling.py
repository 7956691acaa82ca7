"""Kimi Linear with KDA layers only, decoding one token per sequence (slot) per call."""

from __future__ import annotations

import logging

import torch
from torch import nn

from .kernels import kda_log_decay, l2norm

LOG = logging.getLogger("axolotl_kda.modeling")


class KimiLinearConfig:
    model_type = "kimi_linear"

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 16,
        num_hidden_layers: int = 2,
        num_heads: int = 2,
        num_v_heads: int = 4,
        head_k_dim: int = 8,
        head_v_dim: int = 8,
        rms_norm_eps: float = 1e-6,
        use_qk_l2norm: bool = True,
        gate_lower_bound: float | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.head_k_dim = head_k_dim
        self.head_v_dim = head_v_dim
        self.rms_norm_eps = rms_norm_eps
        self.use_qk_l2norm = use_qk_l2norm
        self.gate_lower_bound = gate_lower_bound
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_cfg(cls, cfg) -> "KimiLinearConfig":
        """The model config for an axolotl config (model sizes at the top level, heads under ``kda``)."""
        kda = cfg.kda
        return cls(
            vocab_size=cfg.vocab_size or 32,
            hidden_size=cfg.hidden_size or 16,
            num_hidden_layers=cfg.num_hidden_layers or 2,
            num_heads=kda.num_heads,
            num_v_heads=kda.num_v_heads,
            head_k_dim=kda.head_k_dim,
            head_v_dim=kda.head_v_dim,
            use_qk_l2norm=kda.use_qk_l2norm is not False,
            gate_lower_bound=kda.gate_lower_bound,
        )


class KimiRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden_states.to(dtype)


class KimiDeltaAttention(nn.Module):
    """KDA token mixer; ``allocate_cache`` keeps one recurrent state per slot."""

    def __init__(self, config: KimiLinearConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_k_dim, self.head_v_dim = config.head_k_dim, config.head_v_dim
        key_dim = self.num_heads * self.head_k_dim
        value_dim = self.num_v_heads * self.head_v_dim
        self.q_proj = nn.Linear(config.hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, value_dim, bias=False)
        self.f_proj = nn.Linear(config.hidden_size, self.num_v_heads * self.head_k_dim, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, self.num_v_heads, bias=False)
        self.o_proj = nn.Linear(value_dim, config.hidden_size, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, self.num_v_heads)))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, self.num_v_heads * self.head_k_dim))

    def project(self, hidden_states):
        """``(mixed_qkv, a, b)`` of the decode kernel for ``hidden_states`` ``[B, hidden]``."""
        mixed_qkv = torch.cat(
            [self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1
        )
        return mixed_qkv, self.f_proj(hidden_states), self.b_proj(hidden_states)

    def allocate_cache(self, num_slots: int, dtype=None, **kwargs):
        dtype = dtype or self.o_proj.weight.dtype
        shape = (num_slots, self.num_v_heads, self.head_v_dim, self.head_k_dim)
        self.register_buffer("recurrent_state", torch.zeros(shape, dtype=dtype), persistent=False)

    def forward(self, hidden_states, slot_ids, **kwargs):
        batch = hidden_states.shape[0]
        H, HV, K, V = self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        mixed_qkv, a, b = self.project(hidden_states)
        qkv = mixed_qkv.float()
        q = qkv[:, : H * K].view(batch, H, K)
        k = qkv[:, H * K : 2 * H * K].view(batch, H, K)
        v = qkv[:, 2 * H * K :].view(batch, HV, V)
        if self.config.use_qk_l2norm:
            q, k = l2norm(q), l2norm(k)
        heads = torch.arange(HV) // (HV // H)
        q, k = q[:, heads] * K**-0.5, k[:, heads]
        alpha = kda_log_decay(a.view(batch, HV, K), self.A_log, self.dt_bias, self.config.gate_lower_bound).exp()
        beta = torch.sigmoid(b.float())
        index = slot_ids.long()
        state = self.recurrent_state[index].float() * alpha[:, :, None, :]
        delta = beta[..., None] * (v - torch.einsum("bhvk,bhk->bhv", state, k))
        state = state + delta[..., None] * k[:, :, None, :]
        self.recurrent_state[index] = state.to(self.recurrent_state.dtype)
        out = torch.einsum("bhvk,bhk->bhv", state, q)
        return self.o_proj(out.reshape(batch, -1).to(self.o_proj.weight.dtype))


class KimiDecoderLayer(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = KimiRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = KimiDeltaAttention(config, layer_idx)

    def forward(self, hidden_states, slot_ids, **kwargs):
        return hidden_states + self.self_attn(self.input_layernorm(hidden_states), slot_ids, **kwargs)


class KimiLinearModel(nn.Module):
    def __init__(self, config: KimiLinearConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KimiDecoderLayer(config, idx) for idx in range(config.num_hidden_layers))
        self.norm = KimiRMSNorm(config.hidden_size, config.rms_norm_eps)

    def setup_caches(self, num_slots: int, **kwargs):
        for layer in self.layers:
            layer.self_attn.allocate_cache(num_slots, **kwargs)

    def forward(self, input_ids, slot_ids, force_flush=None, kda_rings=None, **kwargs):
        """``kda_rings`` (one entry per layer) decodes in caches other than the layers' own."""
        hidden_states = self.embed_tokens(input_ids)
        for idx, layer in enumerate(self.layers):
            layer_kwargs = dict(kwargs, force_flush=force_flush)
            if kda_rings is not None:
                layer_kwargs["kda_rings"] = kda_rings[idx]
            hidden_states = layer(hidden_states, slot_ids, **layer_kwargs)
        return self.norm(hidden_states)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: KimiLinearConfig):
        super().__init__()
        self.config = config
        self.model = KimiLinearModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def kda_layers(self) -> list[KimiDeltaAttention]:
        return [layer.self_attn for layer in self.model.layers]

    def setup_caches(self, num_slots: int, **kwargs):
        self.model.setup_caches(num_slots, **kwargs)

    def forward(self, input_ids, slot_ids, **kwargs):
        return self.lm_head(self.model(input_ids, slot_ids, **kwargs))
