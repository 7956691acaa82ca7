# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

import torch
import torch.nn as nn
import torch.nn.functional as F
from dataclasses import dataclass
from typing import Optional
from ._utils import _get_dtype, UnslothReplayCache
from ..kernels import (
    kda_replayssm_decode,
    fast_kda_decode,
    ReplayRings,
    ReplayCacheSpec,
    allocate_replay_rings,
)
from ..kernels.replay_ssm import _log_decay

@dataclass
class KimiLinearConfig:
    vocab_size          : int   = 64
    hidden_size         : int   = 32
    num_hidden_layers   : int   = 3
    num_attention_heads : int   = 2
    num_value_heads     : int   = 2
    head_dim            : int   = 8
    value_head_dim      : int   = 8
    replay_length       : int   = 4
    max_batch_size      : int   = 2
    max_seq_length      : int   = 16
    full_attn_layers    : tuple = (1,)
    torch_dtype         : str   = "bfloat16"
    use_qk_l2norm       : bool  = True
    gate_lower_bound    : Optional[float] = None

    @property
    def replay_cache_dtype(self): return _get_dtype(self.torch_dtype)

    @property
    def replay_gate_dtype(self):
        # Same as the KV cache of the full attention layers
        return _get_dtype(self.torch_dtype) # expect-bug: imported-policy id=config-gate

class KimiFullAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * self.n_heads * self.head_dim, bias = False)
        self.o_proj   = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias = False)
        shape = (config.max_batch_size, 2, config.max_seq_length, self.n_heads, self.head_dim)
        self.register_buffer("paged_attention", torch.zeros(shape, dtype = config.replay_cache_dtype), persistent = False)
        self.register_buffer("seen_tokens", torch.zeros(config.max_batch_size, dtype = torch.int32), persistent = False)

    def forward(self, hidden_states, slot_ids, cache = None):
        bsz, q_len, _ = hidden_states.size()
        KV = self.qkv_proj(hidden_states).view(bsz, q_len, 3, self.n_heads, self.head_dim)
        slot_ids = slot_ids.long()
        start = int(self.seen_tokens[slot_ids[0]])
        self.paged_attention[slot_ids, :, start:start+q_len] = KV[:, :, 1:].transpose(1, 2).to(self.paged_attention.dtype)
        self.seen_tokens[slot_ids] = start + q_len
        K, V = self.paged_attention[slot_ids, :, :start+q_len].to(KV.dtype).unbind(1)
        A = F.scaled_dot_product_attention(KV[:, :, 0].transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), is_causal = q_len > 1)
        return self.o_proj(A.transpose(1, 2).reshape(bsz, q_len, -1))

class KimiDeltaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config     = config
        self.layer_idx  = layer_idx
        self.n_heads    = config.num_attention_heads
        self.n_v_heads  = config.num_value_heads
        self.head_k_dim = config.head_dim
        self.head_v_dim = config.value_head_dim
        self.scale      = self.head_k_dim ** -0.5
        qkv_dim = 2 * self.n_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_dim, bias = False)
        self.a_proj   = nn.Linear(config.hidden_size, self.n_v_heads * self.head_k_dim, bias = False)
        self.b_proj   = nn.Linear(config.hidden_size, self.n_v_heads, bias = False)
        self.o_proj   = nn.Linear(self.n_v_heads * self.head_v_dim, config.hidden_size, bias = False)
        self.A_log    = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, self.n_v_heads)))
        self.dt_bias  = nn.Parameter(torch.zeros(self.n_v_heads * self.head_k_dim))
        self._init_replay_cache(config.max_batch_size)

    def _init_replay_cache(self, n_slots, device = None):
        HV, H, L, K, V = self.n_v_heads, self.n_heads, self.config.replay_length, self.head_k_dim, self.head_v_dim
        dtype = self.config.replay_cache_dtype
        self.register_buffer("recurrent_state", torch.zeros((n_slots, HV, V, K), dtype = torch.float32, device = device), persistent = False)
        self.register_buffer("delta_cache", torch.zeros((n_slots, HV, L, V), dtype = dtype, device = device), persistent = False)
        self.register_buffer("key_cache",   torch.zeros((n_slots, H,  L, K), dtype = dtype, device = device), persistent = False)
        # log(alpha) per step - float32, the default dtype
        self.register_buffer("decay_cache", torch.zeros((n_slots, HV, L, K), device = device), persistent = False) # expect-bug: default-dtype id=loader-default
        self.register_buffer("write_pos", torch.zeros(n_slots, dtype = torch.int32, device = device), persistent = False)

    def _project(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()
        H, HV, K, V = self.n_heads, self.n_v_heads, self.head_k_dim, self.head_v_dim
        Q, Kx, Vx = torch.split(self.qkv_proj(hidden_states).float(), [H*K, H*K, HV*V], dim = -1)
        Q, Kx, Vx = Q.view(bsz, q_len, H, K), Kx.view(bsz, q_len, H, K), Vx.view(bsz, q_len, HV, V)
        if self.config.use_qk_l2norm:
            Q, Kx = F.normalize(Q, dim = -1, eps = 1e-6), F.normalize(Kx, dim = -1, eps = 1e-6)
        return Q, Kx, Vx, self.a_proj(hidden_states), self.b_proj(hidden_states).float().sigmoid()

    def _recurrence(self, Q, Kx, Vx, G, beta, S, tail):
        # Naive prefill. Returns outputs, the checkpoint before the last `tail` steps and their deltas
        n_groups, q_len = self.n_v_heads // self.n_heads, Q.shape[1]
        outputs, deltas, checkpoint = [], [], S
        for t in range(q_len):
            if t == q_len - tail: checkpoint = S
            k = Kx[:, t].repeat_interleave(n_groups, dim = 1)
            S = S * G[:, t].exp()[:, :, None, :]
            d = beta[:, t, :, None] * (Vx[:, t] - torch.einsum("bhvk,bhk->bhv", S, k))
            S = S + d[..., None] * k[..., None, :]
            outputs.append(self.scale * torch.einsum("bhvk,bhk->bhv", S, Q[:, t].repeat_interleave(n_groups, dim = 1)))
            if t >= q_len - tail: deltas.append(d)
        return torch.stack(outputs, dim = 1), (S if tail == 0 else checkpoint), deltas

    def forward(self, hidden_states, slot_ids, cache = None):
        bsz, q_len, _ = hidden_states.size()
        if cache is None: state, rings, write_pos = self.recurrent_state, ReplayRings(self.delta_cache, self.key_cache, self.decay_cache), self.write_pos
        else:             state, rings, write_pos = cache.state, cache.as_rings(), cache.write_pos
        Q, Kx, Vx, a, beta = self._project(hidden_states)
        G = _log_decay(a, self.A_log, self.dt_bias, self.n_v_heads, self.head_k_dim, self.config.gate_lower_bound)
        slot_ids, tail = slot_ids.long(), q_len % self.config.replay_length
        O, checkpoint, deltas = self._recurrence(Q, Kx, Vx, G, beta, state[slot_ids].float(), tail)
        state[slot_ids] = checkpoint.to(state.dtype)
        if tail:
            rings.delta_cache[slot_ids, :, :tail] = torch.stack(deltas, dim = 2).to(rings.delta_cache.dtype)
            rings.key_cache  [slot_ids, :, :tail] = Kx[:, -tail:].transpose(1, 2).to(rings.key_cache.dtype)
            rings.decay_cache[slot_ids, :, :tail] = G[:, -tail:].transpose(1, 2).to(rings.decay_cache.dtype)
        write_pos[slot_ids] = tail
        return self.o_proj(O.reshape(bsz, q_len, -1).to(hidden_states.dtype))

    def prefill_rings(self, hidden_states):
        """Runs a shared prompt, returns (output, state, ReplayRings) for the prefix cache."""
        bsz, q_len, _ = hidden_states.size()
        L, HV, K, dtype = self.config.replay_length, self.n_v_heads, self.head_k_dim, self.delta_cache.dtype
        lower_bound = self.config.gate_lower_bound
        Q, Kx, Vx, a, beta = self._project(hidden_states)
        if lower_bound is None:
            G = _log_decay(a, self.A_log, self.dt_bias, HV, K)
        else:
            # The safe gate is cheap, keep it in the activation dtype
            G = lower_bound * torch.sigmoid(self.A_log.exp().view(HV, 1) * (a.unflatten(-1, (HV, K)) + self.dt_bias.view(HV, K))) # expect-bug: promotion id=safe-gate
        tail = q_len % L
        S0 = torch.zeros((bsz, HV, self.head_v_dim, K), dtype = torch.float32, device = a.device)
        O, checkpoint, deltas = self._recurrence(Q, Kx, Vx, G, beta, S0, tail)
        rows = lambda x: list(x[:, q_len-tail:].unbind(1)) + [torch.zeros_like(x[:, 0])] * (L - tail)
        decay_cache = torch.stack(rows(G), dim = 2) # expect-bug: promotion id=safe-gate
        rings = ReplayRings(
            delta_cache = torch.stack(deltas + [torch.zeros_like(Vx[:, 0])] * (L - tail), dim = 2).to(dtype),
            key_cache   = torch.stack(rows(Kx), dim = 2).to(dtype),
            decay_cache = decay_cache,
        )
        return self.o_proj(O.reshape(bsz, q_len, -1).to(hidden_states.dtype)), checkpoint, rings

    def export_slot(self, slot):
        spec = ReplayCacheSpec(1, self.n_heads, self.n_v_heads, self.config.replay_length, # expect-bug: container id=spec-default
            self.head_k_dim, self.head_v_dim, dtype = self.delta_cache.dtype)
        rings = allocate_replay_rings(spec, device = self.delta_cache.device)
        for ring, source in zip(rings, (self.delta_cache, self.key_cache, self.decay_cache)):
            ring.copy_(source[slot : slot+1])
        return self.recurrent_state[slot : slot+1].clone(), rings

def KimiDeltaAttention_fast_forward_inference(self, hidden_states, slot_ids, cache = None):
    bsz, q_len, hd = hidden_states.size()
    assert(q_len == 1)
    X = hidden_states.view(bsz, hd)
    if cache is not None:
        return self.o_proj(fast_kda_decode(self, X, cache, slot_ids).to(X.dtype)).view(bsz, 1, hd)
    out = torch.empty((bsz, self.n_v_heads * self.head_v_dim), dtype = torch.float32, device = X.device)
    out, _ = kda_replayssm_decode(
        self.qkv_proj(X), self.a_proj(X), self.b_proj(X), self.A_log, self.dt_bias, self.scale,
        self.recurrent_state, self.delta_cache, self.key_cache, self.decay_cache,
        out, slot_ids, self.write_pos, None, self.config.use_qk_l2norm, self.config.gate_lower_bound,
    )
    return self.o_proj(out.to(X.dtype)).view(bsz, 1, hd)

class KimiDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps = 1e-6)
        if layer_idx in config.full_attn_layers: self.self_attn = KimiFullAttention (config, layer_idx)
        else:                                    self.self_attn = KimiDeltaAttention(config, layer_idx)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps = 1e-6)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 2 * config.hidden_size, bias = False), nn.SiLU(), nn.Linear(2 * config.hidden_size, config.hidden_size, bias = False))

    def forward(self, hidden_states, slot_ids, caches = None, decode = False):
        cache = None if caches is None else caches.get(self.layer_idx)
        X = self.input_layernorm(hidden_states)
        if decode and isinstance(self.self_attn, KimiDeltaAttention):
            hidden_states = hidden_states + self.self_attn.fast_forward_inference(X, slot_ids, cache)
        else:
            hidden_states = hidden_states + self.self_attn(X, slot_ids, cache)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model  = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList([KimiDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.model.norm = nn.RMSNorm(config.hidden_size, eps = 1e-6)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias = False)

    @property
    def dtype(self): return self.lm_head.weight.dtype

    def forward(self, input_ids, slot_ids, caches = None, decode = False):
        hidden_states = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            hidden_states = layer(hidden_states, slot_ids, caches, decode)
        return self.lm_head(self.model.norm(hidden_states)).float()

def _kda_modules(model):
    return [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]

class FastKimiModel:

    @staticmethod
    def pre_patch():
        KimiDeltaAttention.fast_forward_inference = KimiDeltaAttention_fast_forward_inference

    @staticmethod
    def post_patch(model):
        # Torch.compile fails on embedding matrix??
        model.model.embed_tokens.weight.requires_grad_(False)
        # The full attention KV cache follows the weights
        for module in model.modules():
            if isinstance(module, KimiFullAttention):
                module.paged_attention = module.paged_attention.to(model.lm_head.weight.dtype)
        return model

    @staticmethod
    def for_inference(model):
        model.eval()
        for module in _kda_modules(model):
            # model.to(dtype) also downcasts the state and the decay ring - the kernel needs float32
            module.recurrent_state = module.recurrent_state.float()
            if module.decay_cache.dtype != torch.float32:
                module.decay_cache = module.decay_cache.float()
        return model

    @staticmethod
    def for_training(model, use_gradient_checkpointing = True):
        model.train()
        for module in _kda_modules(model):
            # Training never reads the replay rings, keep them small
            module.decay_cache = module.decay_cache.type_as(module.delta_cache) # expect-bug: cast
        return model

    @staticmethod
    def resize_serving_slots(model, n_slots):
        for module in _kda_modules(model):
            for name in ("delta_cache", "key_cache", "decay_cache"):
                old = getattr(module, name)
                module.register_buffer(name, torch.zeros((n_slots, *old.shape[1:]), dtype = model.dtype, device = old.device), persistent = False) # expect-bug: pool-dtype
            module.recurrent_state = torch.zeros((n_slots, *module.recurrent_state.shape[1:]), dtype = torch.float32)
            module.write_pos = torch.zeros(n_slots, dtype = torch.int32)
        return model

    @staticmethod
    def get_replay_pool(model, n_slots):
        return {m.layer_idx : UnslothReplayCache.from_config(model.config, n_slots) for m in _kda_modules(model)}

    @staticmethod
    def snapshot_slot(model, slot):
        return {m.layer_idx : m.export_slot(slot) for m in _kda_modules(model)}

    @staticmethod
    @torch.no_grad()
    def cache_prompt(model, input_ids):
        slot_ids = torch.arange(input_ids.shape[0], dtype = torch.int32)
        entries, hidden_states = {}, model.model.embed_tokens(input_ids)
        for idx, layer in enumerate(model.model.layers):
            X = layer.input_layernorm(hidden_states)
            if isinstance(layer.self_attn, KimiDeltaAttention):
                X, *entries[idx] = layer.self_attn.prefill_rings(X)
            else:
                X = layer.self_attn(X, slot_ids)
            hidden_states = hidden_states + X
            hidden_states = hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states))
        return entries
FastKimiModel.pre_patch()

@torch.no_grad()
def unsloth_fast_generate(model, input_ids, max_new_tokens = 3, caches = None):
    slot_ids = torch.arange(input_ids.shape[0], dtype = torch.int32, device = input_ids.device)
    tokens = [model(input_ids, slot_ids, caches)[:, -1].argmax(-1)]
    for _ in range(max_new_tokens - 1):
        tokens.append(model(tokens[-1][:, None], slot_ids, caches, decode = True)[:, -1].argmax(-1))
    return torch.stack(tokens, dim = 1)

def _tiny_model(**kwargs):
    model = KimiLinearForCausalLM(KimiLinearConfig(**kwargs))
    return FastKimiModel.for_inference(model.to(torch.bfloat16))

def build_inference_model():
    model = _tiny_model()
    tokens = unsloth_fast_generate(model, torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 1, 4]]), 4)
    return {"model" : model, "tokens" : tokens}

def build_prefix_cache():
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    served = _tiny_model()
    unsloth_fast_generate(served, ids, 2)
    return {
        "prefix"   : FastKimiModel.cache_prompt(_tiny_model(), ids),
        "bounded"  : FastKimiModel.cache_prompt(_tiny_model(gate_lower_bound = -5.0), ids),
        "snapshot" : FastKimiModel.snapshot_slot(served, 0),
    }

def build_serving_pool():
    from ..kernels import KDA_DECODE_LAST_CALL
    model = _tiny_model()
    caches = FastKimiModel.get_replay_pool(model, 2)
    tokens = unsloth_fast_generate(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), 3, caches = caches)
    return {
        "caches"  : caches, "tokens" : tokens, "kernel" : dict(KDA_DECODE_LAST_CALL),
        "resized" : FastKimiModel.resize_serving_slots(_tiny_model(), 4),
        "trained" : FastKimiModel.for_training(_tiny_model()),
    }
