"""A small hybrid model with Kimi Delta Attention layers decoding through ReplaySSM buffers."""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from .kernels import fused_recurrent_kda_replayssm_decode
from .utils.modeling import get_torch_dtype


@dataclass
class KdaConfig:
    model_type = "kimi_linear"
    vocab_size: int = 32
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 4
    head_v_dim: int = 4
    replay_ring_len: int = 4
    replay_num_slots: int = 2
    lower_bound: float = -5.0
    torch_dtype: str = "float32"


@contextmanager
def _default_dtype(dtype: torch.dtype):
    """Instantiates a model directly in `dtype`, without a float32 copy of the weights first."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class ReplayLayerCache(NamedTuple):
    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


class ReplayStateBuffers(nn.Module):
    """Per-slot ReplaySSM buffers of one KDA layer. The float32 state and gate ring keep their dtype through `.to()`,
    `.half()` and `.bfloat16()` (see `_apply`): only their device follows the module."""

    _keep_in_fp32_buffers = ("state", "g_cache")

    def __init__(self, num_slots, num_heads, num_v_heads, ring_len, head_k_dim, head_v_dim, dtype=None):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self.register_buffer("state", torch.zeros(num_slots, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32), persistent=False)
        self.register_buffer("d_cache", torch.zeros(num_slots, num_v_heads, ring_len, head_v_dim, dtype=dtype), persistent=False)
        self.register_buffer("k_cache", torch.zeros(num_slots, num_heads, ring_len, head_k_dim, dtype=dtype), persistent=False)
        self.register_buffer("g_cache", torch.zeros(num_slots, num_v_heads, ring_len, head_k_dim), persistent=False)  # expect-bug: default-dtype id=from-config
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in self._keep_in_fp32_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            moved = self._buffers[name]
            if moved.dtype != buffer.dtype:
                self._buffers[name] = buffer.to(device=moved.device)
        return self

    def as_cache(self) -> ReplayLayerCache:
        return ReplayLayerCache(self.state, self.d_cache, self.k_cache, self.g_cache, self.write_pos)


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KdaConfig, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_k_dim, self.head_v_dim = config.head_k_dim, config.head_v_dim
        self.ring_len = config.replay_ring_len
        self.lower_bound = config.lower_bound
        self.scale = self.head_k_dim**-0.5
        self.key_dim = self.num_heads * self.head_k_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 2 * self.key_dim + self.num_v_heads * self.head_v_dim, bias=False)
        self.a_proj = nn.Linear(config.hidden_size, self.num_v_heads * self.head_k_dim, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, self.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_v_heads * self.head_k_dim))
        self.o_proj = nn.Linear(self.num_v_heads * self.head_v_dim, config.hidden_size, bias=False)
        self.replay = ReplayStateBuffers(
            config.replay_num_slots, self.num_heads, self.num_v_heads, self.ring_len, self.head_k_dim, self.head_v_dim
        )
        self.decode_fn = None  # set by `ReplayDecodeHook`: a decode step with the buffers already bound

    def forward(self, hidden_states, slot_ids, cache: Optional[ReplayLayerCache] = None):
        bsz = hidden_states.shape[0]
        mixed_qkv, a, b = self.qkv_proj(hidden_states), self.a_proj(hidden_states), self.b_proj(hidden_states)
        out = hidden_states.new_zeros(bsz, self.num_v_heads, self.head_v_dim)
        if cache is None and self.decode_fn is not None:
            out, _ = self.decode_fn(
                mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, out=out, ssm_state_indices=slot_ids,
                use_qk_l2norm_in_kernel=True, lower_bound=self.lower_bound,
            )
        else:
            cache = self.replay.as_cache() if cache is None else cache
            out, _ = fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, cache.state, cache.d_cache, cache.k_cache,
                cache.g_cache, out, slot_ids, cache.write_pos, None, True, self.lower_bound,
            )
        return self.o_proj(out.reshape(bsz, -1))

    def prefill_snapshot(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Ring rows `[heads, n, dim]` of the last `ring_len` prompt tokens: what a fresh slot starts from, and what
        the prefix cache keeps."""
        tail = hidden_states[-self.ring_len :]
        n = tail.shape[0]
        qkv = self.qkv_proj(tail)
        k = qkv[:, self.key_dim : 2 * self.key_dim].view(n, self.num_heads, self.head_k_dim).transpose(0, 1)
        v = qkv[:, 2 * self.key_dim :].view(n, self.num_v_heads, self.head_v_dim).transpose(0, 1)
        beta = torch.sigmoid(self.b_proj(tail)).transpose(0, 1)
        gate_logits = self.a_proj(tail).view(n, self.num_v_heads, self.head_k_dim).transpose(0, 1)
        log_g = self.lower_bound * torch.sigmoid(gate_logits)  # expect-bug: promotion
        return {"d_cache": (beta[..., None] * v).contiguous(), "k_cache": k.contiguous(), "g_cache": log_g.contiguous()}

    @torch.no_grad()
    def seed_slot(self, slot: int, hidden_states: torch.Tensor):
        """Writes the prompt's last rows into the rings of `slot` (the state of a fresh slot is zero)."""
        rows = self.prefill_snapshot(hidden_states)
        n = rows["g_cache"].shape[1]
        self.replay.d_cache[slot, :, :n].copy_(rows["d_cache"])
        self.replay.k_cache[slot, :, :n].copy_(rows["k_cache"])
        self.replay.g_cache[slot, :, :n].copy_(rows["g_cache"])
        self.replay.write_pos[slot] = n


class KdaDecoderLayer(nn.Module):
    def __init__(self, config: KdaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.self_attn = KimiDeltaAttention(config, layer_idx)

    def forward(self, hidden_states, slot_ids, cache: Optional[ReplayLayerCache] = None):
        return hidden_states + self.self_attn(self.input_layernorm(hidden_states), slot_ids, cache=cache)


class KdaForCausalLM(nn.Module):
    _no_split_modules = ["KdaDecoderLayer"]

    def __init__(self, config: KdaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KdaDecoderLayer(config, idx) for idx in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_config(cls, config: KdaConfig, torch_dtype=None) -> "KdaForCausalLM":
        """Builds the model directly in `torch_dtype` (default: `config.torch_dtype`)."""
        torch_dtype = get_torch_dtype(torch_dtype or config.torch_dtype)
        with _default_dtype(torch_dtype):  # expect-bug: default-dtype id=from-config
            model = cls(config)
        return model

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def replay_caches(self) -> list[ReplayLayerCache]:
        return [layer.self_attn.replay.as_cache() for layer in self.layers]

    def forward(self, input_ids, slot_ids, caches: Optional[list[ReplayLayerCache]] = None):
        hidden_states = self.embed_tokens(input_ids)
        for idx, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, slot_ids, cache=None if caches is None else caches[idx])
        return self.lm_head(hidden_states)


def build_from_config_bf16():
    return KdaForCausalLM.from_config(KdaConfig(torch_dtype="bfloat16"))


def build_model_to_bf16():
    model = KdaForCausalLM(KdaConfig()).to(torch.bfloat16)
    model(torch.tensor([3, 5]), torch.tensor([0, 1]))
    return model


def build_prefill_snapshot_bf16():
    model = KdaForCausalLM(KdaConfig()).bfloat16()
    with torch.no_grad():
        hidden = model.embed_tokens(torch.arange(6))
        return [layer.self_attn.prefill_snapshot(hidden) for layer in model.layers]


def build_seed_slot_bf16():
    model = KdaForCausalLM(KdaConfig()).to(torch.bfloat16)
    with torch.no_grad():
        hidden = model.embed_tokens(torch.arange(6))
        for layer in model.layers:
            layer.self_attn.seed_slot(1, hidden)
    return model
