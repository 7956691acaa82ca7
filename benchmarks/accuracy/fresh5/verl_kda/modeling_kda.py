# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.
"""Kimi Delta Attention (KDA) model shared by the actor and the hf rollout, with its ReplaySSM decode path."""

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .utils import set_default_torch_dtype
from .utils.torch_dtypes import PrecisionType

# inputs of the last decode call, read by the rollout debug hooks
LAST_DECODE_INPUTS = {}


def kda_replayssm_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache,
    out, ssm_state_indices, write_pos, force_flush=None, use_qk_l2norm_in_kernel=False, lower_bound=None,
):
    """Torch reference of the fused ReplaySSM decode kernel (one token per sequence)."""
    LAST_DECODE_INPUTS.clear()
    LAST_DECODE_INPUTS.update(
        mixed_qkv=mixed_qkv, a=a, b=b, initial_state=initial_state, d_cache=d_cache, k_cache=k_cache,
        g_cache=g_cache, out=out, ssm_state_indices=ssm_state_indices, write_pos=write_pos,
    )
    H, L, K = k_cache.shape[1:]
    HV, V = d_cache.shape[1], d_cache.shape[-1]
    q, k, v = (x.unflatten(-1, (n, -1)) for x, n in zip(mixed_qkv.float().split([H * K, H * K, HV * V], -1), (H, H, HV)))
    if use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = -A_log.float().exp()[:, None] * F.softplus(a.float().view(-1, HV, K) + dt_bias.float().view(HV, K))
    g, beta = g if lower_bound is None else g.clamp_min(lower_bound), b.float().sigmoid()
    for i, (slot, pos) in enumerate(zip(ssm_state_indices.tolist(), write_pos.tolist())):
        k_cache[slot, :, pos] = k[i]
        d_cache[slot, :, pos] = v[i] * beta[i, :, None]
        g_cache[slot, :, pos] = g[i]
        state = initial_state[slot].float()
        for t in range(pos + 1):
            k_t = k_cache[slot, :, t].float().repeat_interleave(HV // H, dim=0)
            state = state * g_cache[slot, :, t].float().exp()[:, None, :]
            state = state + d_cache[slot, :, t].float()[:, :, None] * k_t[:, None, :]
        out[i] = torch.einsum("hvk,hk->hv", state, q[i].repeat_interleave(HV // H, dim=0) * scale)
        if pos + 1 == L or (force_flush is not None and bool(force_flush[i])):
            initial_state[slot] = state
    return out, initial_state


@dataclass
class KDAConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 2
    head_dim: int = 8
    replay_ring_len: int = 4
    max_num_seqs: int = 2
    torch_dtype: str = "bfloat16"
    gate_lower_bound: Optional[float] = None


class LayerReplayCache(NamedTuple):  # engine-owned replay cache of one layer, in the kernel's argument names
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    initial_state: torch.Tensor


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KDAConfig, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_v_heads, self.head_dim = config.num_heads, config.num_v_heads, config.head_dim
        self.scale, self.lower_bound = self.head_dim**-0.5, config.gate_lower_bound
        H, HV, D = self.num_heads, self.num_v_heads, self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, (2 * H + HV) * D, bias=False)
        self.a_proj = nn.Linear(config.hidden_size, HV * D, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, HV, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, HV)))
        self.dt_bias = nn.Parameter(torch.zeros(HV * D))
        self.o_proj = nn.Linear(HV * D, config.hidden_size, bias=False)

        # replay cache of the hf rollout, the delta/key rings follow the model dtype
        S, L = config.max_num_seqs, config.replay_ring_len
        self.register_buffer("delta_buffer", torch.zeros(S, HV, L, D), persistent=False)
        self.register_buffer("key_buffer", torch.zeros(S, H, L, D), persistent=False)
        self.register_buffer("decay_buffer", torch.zeros(S, HV, L, D), persistent=False)  # expect-bug: default-dtype id=pretrained-default
        self.register_buffer("state_buffer", torch.zeros(S, HV, D, D, dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() only move the fp32 checkpoint state, its dtype is kept
        state = self.state_buffer
        super()._apply(fn, recurse)
        self.state_buffer = state.to(self.delta_buffer.device)
        return self

    def forward_decode(self, hidden_states, slots, write_pos, cache: Optional[LayerReplayCache] = None):
        mixed_qkv = self.qkv_proj(hidden_states)
        a, b = self.a_proj(hidden_states), self.b_proj(hidden_states)
        out = hidden_states.new_empty(hidden_states.shape[0], self.num_v_heads, self.head_dim)
        if cache is None:
            out, _ = kda_replayssm_decode(
                mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, self.state_buffer, self.delta_buffer,
                self.key_buffer, self.decay_buffer, out, slots, write_pos, None, True, self.lower_bound,
            )
        else:
            out, _ = kda_replayssm_decode(
                mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, out=out, ssm_state_indices=slots,
                write_pos=write_pos, use_qk_l2norm_in_kernel=True, lower_bound=self.lower_bound, **cache._asdict(),
            )
        return self.o_proj(out.flatten(1))

    def replay_window(self, hidden_states):
        """(delta, key, log_decay) of a chunk of tokens as the actor forward computes them, [B, heads, T, D]."""
        (B, T, _), H, HV, D = hidden_states.shape, self.num_heads, self.num_v_heads, self.head_dim
        _, k, v = self.qkv_proj(hidden_states).split([H * D, H * D, HV * D], dim=-1)
        delta = v.view(B, T, HV, D) * self.b_proj(hidden_states).sigmoid()[..., None]
        a = self.a_proj(hidden_states).view(B, T, HV, D)
        log_decay = -self.A_log.exp()[:, None] * F.softplus(a + self.dt_bias.view(HV, D))
        return delta.transpose(1, 2), k.view(B, T, H, D).transpose(1, 2), log_decay.transpose(1, 2)

    @torch.no_grad()
    def reset_replay_cache(self, max_num_seqs=None):
        """Re-allocates (zeroed) hf replay buffers, e.g. when the rollout batch size changes."""
        S = max_num_seqs or self.delta_buffer.shape[0]
        H, HV, L, D = self.num_heads, self.num_v_heads, self.delta_buffer.shape[2], self.head_dim
        self.delta_buffer = self.delta_buffer.new_zeros(S, HV, L, D)
        self.key_buffer = self.key_buffer.new_zeros(S, H, L, D)
        self.decay_buffer = self.delta_buffer.new_zeros(S, HV, L, D)  # expect-bug: like
        self.state_buffer = self.state_buffer.new_zeros(S, HV, D, D)


class KDAForCausalLM(nn.Module):
    def __init__(self, config: KDAConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KimiDeltaAttention(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, config: KDAConfig, state_dict=None):
        """Builds the model directly in ``config.torch_dtype``, no fp32 copy is materialised."""
        with set_default_torch_dtype(PrecisionType.to_dtype(config.torch_dtype)):  # expect-bug: default-dtype id=pretrained-default
            model = cls(config)
        if state_dict is not None:
            model.load_state_dict(state_dict)
        return model.eval()

    def restore_fp32_buffers_(self):
        """``module.to(dtype)`` casts every floating buffer, the log-decay rings must stay fp32."""
        for layer in self.layers:
            layer.decay_buffer = layer.decay_buffer.float()
        return self

    @torch.no_grad()
    def load_replay_cache(self, caches):
        """Adopts the engine-owned replay cache as hf buffers (switching the rollout from spmd to hf mode)."""
        for layer, cache in zip(self.layers, caches):
            layer.delta_buffer = cache.d_cache.to(layer.delta_buffer.dtype)
            layer.key_buffer = cache.k_cache.to(layer.key_buffer.dtype)
            layer.decay_buffer = cache.g_cache.type_as(layer.delta_buffer)  # expect-bug: cast
            layer.state_buffer = cache.initial_state.float()

    @torch.no_grad()
    def decode_step(self, input_ids, slots, write_pos, caches=None):
        h = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            h = h + layer.forward_decode(h, slots, write_pos, cache=None if caches is None else caches[i])
        return self.lm_head(self.norm(h)).float()


def _greedy_decode(model, steps, batch_size=2):
    slots, token = torch.arange(batch_size, dtype=torch.int32), torch.arange(batch_size) + 1
    for step in range(steps):
        write_pos = torch.full((batch_size,), step % model.config.replay_ring_len, dtype=torch.int32)
        token = model.decode_step(token, slots, write_pos).argmax(-1)
    return token


def build_hf_decode():
    model = KDAForCausalLM(KDAConfig()).to(torch.bfloat16).restore_fp32_buffers_()
    return {"model": model, "tokens": _greedy_decode(model, steps=6)}


def build_pretrained():
    config = KDAConfig(num_hidden_layers=1)
    pretrained = KDAForCausalLM.from_pretrained(config, state_dict=KDAForCausalLM(config).state_dict())
    tokens = _greedy_decode(pretrained, steps=3)
    resized = KDAForCausalLM(config).to(torch.bfloat16).restore_fp32_buffers_()
    for layer in resized.layers:
        layer.reset_replay_cache(max_num_seqs=3)
    return {"pretrained": pretrained, "resized": resized, "tokens": tokens, "resized_tokens": _greedy_decode(resized, 2, 3)}
