"""A tiny Kimi-Linear causal LM as the model repository ships it (before any injection)."""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class KimiLinearConfig:
    vocab_size: int = 32
    hidden_size: int = 8
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_k_heads: int = 1
    head_dim: int = 4


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_k_heads = config.num_heads, config.num_k_heads
        self.head_dim = config.head_dim
        qk_dim, v_dim = config.num_k_heads * config.head_dim, config.num_heads * config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, qk_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, qk_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, v_dim, bias=False)
        self.f_proj = nn.Linear(config.hidden_size, v_dim, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, config.num_heads, bias=False)
        self.o_proj = nn.Linear(v_dim, config.hidden_size, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, config.num_heads)))
        self.dt_bias = nn.Parameter(torch.zeros(v_dim))


class KimiLinearDecoderLayer(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size)
        self.self_attn: nn.Module = KimiDeltaAttention(config, layer_idx)
        self.mlp = nn.Linear(config.hidden_size, config.hidden_size, bias=False)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            KimiLinearDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = nn.RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def kda_layers(self) -> list[KimiDeltaAttention]:
        return [m for m in self.modules() if isinstance(m, KimiDeltaAttention)]
