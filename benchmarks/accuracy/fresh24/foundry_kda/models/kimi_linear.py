# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Kimi Linear: a decoder of KDA blocks with a ReplaySSM decode path."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from foundry_kda import registry
from foundry_kda.models.kda_attention import (
    KDAConfig,
    KimiDeltaAttention,
    ReplayRingBuffers,
    ReplayRings,
    ReplaySpec,
)

log = logging.getLogger(__name__)

__all__ = [
    "KimiLinearBlock",
    "KimiLinearConfig",
    "KimiLinearForCausalLM",
    "RMSNorm",
    "kimi_linear_from_config",
]


@dataclass
class KimiLinearConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_k_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 8
    head_v_dim: int = 8
    intermediate_size: int = 64
    rms_norm_eps: float = 1e-6
    lower_bound: float | None = None
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> KimiLinearConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            log.warning("ignoring unknown KimiLinearConfig keys: %s", ", ".join(unknown))
        return cls(**{key: value for key, value in values.items() if key in known})

    def kda_config(self) -> KDAConfig:
        return KDAConfig(
            hidden_size=self.hidden_size,
            num_k_heads=self.num_k_heads,
            num_v_heads=self.num_v_heads,
            head_k_dim=self.head_k_dim,
            head_v_dim=self.head_v_dim,
            lower_bound=self.lower_bound,
        )


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class KimiMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class KimiLinearBlock(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = KimiDeltaAttention(config.kda_config(), layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = KimiMLP(config.hidden_size, config.intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden))
        return hidden + self.mlp(self.mlp_norm(hidden))

    def decode(self, hidden: torch.Tensor, rings: ReplayRings, slots: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn.forward_decode(self.attn_norm(hidden), rings, slots)
        return hidden + self.mlp(self.mlp_norm(hidden))


class KimiLinearForCausalLM(nn.Module):
    """Causal LM over KDA blocks.

    ``forward`` runs full sequences; :meth:`decode_step` runs one token per sequence against
    replay caches, either the model's own (:meth:`allocate_decode_cache`) or caches passed in.
    """

    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(KimiLinearBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.decode_cache: nn.ModuleList | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def replay_spec(self) -> ReplaySpec:
        c = self.config
        return ReplaySpec(c.num_hidden_layers, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        return self.lm_head(self.norm(hidden))

    def allocate_decode_cache(
        self, num_slots: int, ring_len: int, dtype: torch.dtype | None = None
    ) -> nn.ModuleList:
        """Allocates the model's own replay caches, one :class:`ReplayRingBuffers` per layer.

        Each ring is one allocation for all layers and the per-layer buffers are views into it,
        so that snapshotting or offloading a ring is a single copy.
        """
        dtype = dtype or self.dtype
        spec = self.replay_spec()
        shapes = spec.ring_shapes(num_slots, ring_len)
        layers = spec.num_layers
        device = self.embed_tokens.weight.device
        state = torch.zeros((layers, *shapes["state"]), dtype=torch.float32, device=device)
        d_cache = torch.zeros((layers, *shapes["d_cache"]), dtype=dtype, device=device)
        k_cache = torch.zeros((layers, *shapes["k_cache"]), dtype=dtype, device=device)
        g_cache = torch.zeros((layers, *shapes["g_cache"]), device=device)  # expect-bug: default-dtype
        write_pos = torch.zeros(layers, num_slots, dtype=torch.int32, device=device)
        self.decode_cache = nn.ModuleList(
            ReplayRingBuffers(state[i], d_cache[i], k_cache[i], g_cache[i], write_pos[i])
            for i in range(layers)
        )
        return self.decode_cache

    def decode_step(
        self,
        input_ids: torch.Tensor,
        slots: torch.Tensor,
        caches: Sequence[ReplayRings] | None = None,
    ) -> torch.Tensor:
        """Logits ``[N, vocab]`` for one token per sequence; sequence ``i`` uses slot ``slots[i]``."""
        caches = self.decode_cache if caches is None else caches
        if caches is None:
            raise RuntimeError("no decode cache: call allocate_decode_cache() or pass caches")
        hidden = self.embed_tokens(input_ids)
        for block, rings in zip(self.blocks, caches, strict=True):
            hidden = block.decode(hidden, rings, slots)
        return self.lm_head(self.norm(hidden))


@registry.architectures.register("kimi_linear")
def kimi_linear_from_config(config: Mapping[str, Any] | KimiLinearConfig) -> KimiLinearForCausalLM:
    if not isinstance(config, KimiLinearConfig):
        config = KimiLinearConfig.from_dict(config)
    return KimiLinearForCausalLM(config)


def build_kimi_linear_tiny() -> dict[str, object]:
    """A two-layer model with its own decode cache, cast to bf16, after five greedy steps."""
    torch.manual_seed(0)
    model = kimi_linear_from_config(KimiLinearConfig())
    model.allocate_decode_cache(num_slots=2, ring_len=4)
    model.to(torch.bfloat16)
    tokens = torch.tensor([3, 7])
    slots = torch.tensor([0, 1])
    logits = model.decode_step(tokens, slots)
    for _ in range(4):
        tokens = logits.argmax(dim=-1)
        logits = model.decode_step(tokens, slots)
    return {"model": model, "logits": logits}
