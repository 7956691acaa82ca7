"""Kimi-Linear for the PyTorch engine: KDA layers that decode on ReplaySSM states."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import tiny_kimi_linear_config
from ..kernels import LAST_CALL, fused_kda_replayssm_decode

DEFAULT_GATE_LOWER_BOUND = -5.0


class KimiDeltaAttention(nn.Module):
    """Kimi delta attention; a decode step reads and advances its sequences' ReplaySSM states."""

    def __init__(self, config: Any, layer_idx: int, dtype=None, device=None) -> None:
        super().__init__()
        linear = config.linear_attn_config
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = linear["num_k_heads"], linear["num_heads"]
        self.head_dim, self.replay_len = linear["head_dim"], linear["replay_len"]
        self.lower_bound = linear.get("gate_lower_bound")
        key_dim, value_dim = self.num_k_heads * self.head_dim, self.num_v_heads * self.head_dim
        hidden, factory = config.hidden_size, {"dtype": dtype, "device": device, "bias": False}
        self.qkv_proj = nn.Linear(hidden, 2 * key_dim + value_dim, **factory)
        self.f_a_proj = nn.Linear(hidden, self.head_dim, **factory)
        self.f_b_proj = nn.Linear(self.head_dim, value_dim, **factory)
        self.b_proj = nn.Linear(hidden, self.num_v_heads, **factory)
        self.o_proj = nn.Linear(value_dim, hidden, **factory)
        fp32 = {"dtype": torch.float32, "device": device}
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads, **fp32))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_v_heads, self.head_dim, **fp32))

    def gate_projection(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raw = self.f_b_proj(self.f_a_proj(hidden_states))
        return raw.unflatten(-1, (self.num_v_heads, self.head_dim))

    def forward(self, hidden_states, state_caches, state_ids, write_pos) -> torch.Tensor:
        """One decode step. hidden_states: [batch, hidden]; state_caches: this layer's states."""
        recurrent_state, d_cache, k_cache, g_cache = state_caches
        mixed_qkv = self.qkv_proj(hidden_states)
        out = mixed_qkv.new_empty(hidden_states.size(0), self.num_v_heads, self.head_dim)
        out, _ = fused_kda_replayssm_decode(
            mixed_qkv,
            self.f_b_proj(self.f_a_proj(hidden_states)),
            self.b_proj(hidden_states),
            self.A_log,
            self.dt_bias,
            self.head_dim**-0.5,
            recurrent_state,
            d_cache,
            k_cache,
            g_cache,
            out,
            state_ids,
            write_pos,
            use_qk_l2norm_in_kernel=True,
            lower_bound=self.lower_bound,
        )
        return self.o_proj(out.flatten(1))


class KimiMTPHead(nn.Module):
    """Multi-token-prediction head: one KDA layer drafting for a single sequence. It keeps that
    sequence's states as buffers (one slot), so a speculative step takes no engine slot."""

    def __init__(self, config: Any, dtype=None, device=None) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False, dtype=dtype, device=device)
        self.attn = KimiDeltaAttention(config, config.num_hidden_layers, dtype=dtype, device=device)
        heads, k_heads = self.attn.num_v_heads, self.attn.num_k_heads
        dim, ring = self.attn.head_dim, self.attn.replay_len
        fp32, model = {"dtype": torch.float32, "device": device}, {"dtype": dtype, "device": device}
        self.register_buffer("recurrent_state", torch.zeros(1, heads, dim, dim, **fp32))
        self.register_buffer("d_cache", torch.zeros(1, heads, ring, dim, **model), persistent=False)
        self.register_buffer(
            "k_cache", torch.zeros(1, k_heads, ring, dim, **model), persistent=False
        )
        self.register_buffer("g_cache", torch.zeros(1, heads, ring, dim, **fp32), persistent=False)
        self.register_buffer("write_pos", torch.zeros(1, dtype=torch.int32, device=device))

    @torch.no_grad()
    def seed_rings(self, hidden_tail: torch.Tensor) -> None:
        """Starts the draft from the target's last ``replay_len`` hidden states (eager path)."""
        raw = self.attn.gate_projection(hidden_tail)
        bound = self.attn.lower_bound or DEFAULT_GATE_LOWER_BOUND
        self.g_cache = (bound * raw.sigmoid()).transpose(0, 1)[None]  # expect-bug: promotion
        self.write_pos.zero_()

    @torch.no_grad()
    def append_gate(self, g_row: torch.Tensor) -> None:
        """Appends one step's log-decays ([heads, head_dim]) and drops the oldest step."""
        self.g_cache = torch.cat([self.g_cache[:, :, 1:], g_row[None, :, None]], dim=2)

    def draft_step(self, hidden_states: torch.Tensor) -> torch.Tensor:
        slot = torch.zeros(1, dtype=torch.int32, device=hidden_states.device)
        states = (self.recurrent_state, self.d_cache, self.k_cache, self.g_cache)
        return self.attn(self.eh_proj(hidden_states), states, slot, self.write_pos)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: Any, dtype=None, device=None) -> None:
        super().__init__()
        self.config = config
        factory = {"dtype": dtype, "device": device}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(
            KimiDeltaAttention(config, idx, **factory)
            for idx in config.linear_attn_config["kda_layers"]
        )
        self.norm = nn.RMSNorm(config.hidden_size, **factory)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        self.mtp = KimiMTPHead(config, **factory) if config.num_nextn_predict_layers else None
        self.replay_states: dict[str, torch.Tensor] | None = None  # eager path, see patch.py

    def forward(self, input_ids, state_caches, state_ids, write_pos) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for idx, layer in enumerate(self.layers):
            layer_states = [cache[:, idx] for cache in state_caches]
            hidden_states = hidden_states + layer(hidden_states, layer_states, state_ids, write_pos)
        return self.lm_head(self.norm(hidden_states))


def _draft_head() -> KimiMTPHead:
    return KimiMTPHead(tiny_kimi_linear_config(), dtype=torch.bfloat16)


def build_mtp_seeded() -> dict[str, torch.Tensor]:
    head = _draft_head()
    head.seed_rings(torch.randn(4, 16, dtype=torch.bfloat16))
    return dict(head.named_buffers())


def build_mtp_append_gate() -> dict[str, Any]:
    head = _draft_head()
    head.append_gate(-torch.rand(2, 4).to(torch.bfloat16))
    head.draft_step(torch.randn(1, 32, dtype=torch.bfloat16))
    return {"buffers": dict(head.named_buffers()), "call": dict(LAST_CALL)}
