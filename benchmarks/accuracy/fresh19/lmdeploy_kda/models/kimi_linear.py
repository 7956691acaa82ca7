# Copyright (c) OpenMMLab. All rights reserved.
from typing import Iterable, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..kernels.replay_decode import next_write_pos, replay_decode_step
from ..model_inputs import ModelInputs, ReplayCache, StepContext, StepContextManager
from ..weight_loader.model_weight_loader import dummy_weights, load_buffer, load_weight


class RMSNorm(nn.Module):
    """RMS norm computed in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = None, device: torch.device = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor):
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


class KimiMLP(nn.Module):
    """Gated MLP with the gate and up projections merged."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = None, device: torch.device = None):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False, dtype=dtype,
                                      device=device)
        self.gate_up_proj.weight.weight_loader = self._gate_up_weight_loader
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False, dtype=dtype,
                                   device=device)

    def _gate_up_weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int):
        param.data[shard_id * self.intermediate_size:(shard_id + 1) * self.intermediate_size].copy_(loaded_weight)

    def forward(self, x: torch.Tensor):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention decoded with ReplaySSM caches."""

    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype = None, device: torch.device = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_v_heads = config.num_value_heads
        self.head_k_dim = config.head_dim
        self.head_v_dim = config.v_head_dim
        self.scale = self.head_k_dim**-0.5
        self.lower_bound = config.lower_bound
        self.use_qk_l2norm = config.use_qk_l2norm
        qk_size = self.num_heads * self.head_k_dim
        self.qkv_proj = nn.Linear(config.hidden_size,
                                  2 * qk_size + self.num_v_heads * self.head_v_dim,
                                  bias=False,
                                  dtype=dtype,
                                  device=device)
        self.qkv_proj.weight.weight_loader = self._qkv_weight_loader
        self.f_proj = nn.Linear(config.hidden_size, self.num_v_heads * self.head_k_dim, bias=False, dtype=dtype,
                                device=device)
        self.b_proj = nn.Linear(config.hidden_size, self.num_v_heads, bias=False, dtype=dtype, device=device)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=dtype, device=device))
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads * self.head_k_dim, dtype=dtype, device=device))
        self.o_proj = nn.Linear(self.num_v_heads * self.head_v_dim, config.hidden_size, bias=False, dtype=dtype,
                                device=device)

    def _qkv_weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str):
        qk_size = self.num_heads * self.head_k_dim
        offsets = dict(q=(0, qk_size), k=(qk_size, 2 * qk_size), v=(2 * qk_size, param.size(0)))
        start, end = offsets[shard_id]
        param.data[start:end].copy_(loaded_weight)

    def _split_qkv(self, mixed_qkv: torch.Tensor):
        qk_size = self.num_heads * self.head_k_dim
        q = mixed_qkv[..., :qk_size].unflatten(-1, (self.num_heads, self.head_k_dim))
        k = mixed_qkv[..., qk_size:2 * qk_size].unflatten(-1, (self.num_heads, self.head_k_dim))
        v = mixed_qkv[..., 2 * qk_size:].unflatten(-1, (self.num_v_heads, self.head_v_dim))
        if self.use_qk_l2norm:
            q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
            k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        return q, k, v

    def forward(self, hidden_states: torch.Tensor, past_key_value: ReplayCache, attn_metadata: StepContext):
        batch = hidden_states.size(0)
        mixed_qkv = self.qkv_proj(hidden_states)
        a = self.f_proj(hidden_states)
        b = self.b_proj(hidden_states)
        if attn_metadata.graph_runner is not None:
            out = attn_metadata.graph_runner.replay_layer(self.layer_idx, mixed_qkv, a, b)
        else:
            out = hidden_states.new_empty(batch, 1, self.num_v_heads, self.head_v_dim)
            replay_decode_step(mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale,
                               initial_state=past_key_value.state,
                               d_cache=past_key_value.delta_cache,
                               k_cache=past_key_value.key_cache,
                               g_cache=past_key_value.gate_cache,
                               out=out,
                               ssm_state_indices=attn_metadata.state_offsets,
                               write_pos=attn_metadata.write_pos,
                               force_flush=attn_metadata.force_flush,
                               use_qk_l2norm_in_kernel=self.use_qk_l2norm,
                               lower_bound=self.lower_bound)
        return self.o_proj(out.reshape(batch, self.num_v_heads * self.head_v_dim))

    @torch.no_grad()
    def prefill_ring(self, hidden_states: torch.Tensor, ring_len: int) -> Tuple[ReplayCache, int]:
        """Replay caches of one sequence whose prompt is shorter than the ring.

        The checkpoint stays zero and every prompt token becomes one ring row, so the draft model
        can start decoding without a chunked prefill. Returns the caches (without a slot dim) and
        the write position.
        """
        num_tokens = hidden_states.size(0)
        if num_tokens >= ring_len:
            raise ValueError(f'prompt of {num_tokens} tokens does not fit a ring of {ring_len} rows.')
        a = self.f_proj(hidden_states).unflatten(-1, (self.num_v_heads, self.head_k_dim))
        beta = torch.sigmoid(self.b_proj(hidden_states)).float()
        x = a + self.dt_bias.view(self.num_v_heads, self.head_k_dim)
        A = self.A_log.exp().unsqueeze(-1)
        if self.lower_bound is None:
            log_decay = -A * F.softplus(x)  # expect-bug: promotion id=prompt-decay
        else:
            log_decay = self.lower_bound * torch.sigmoid(A * x)  # expect-bug: promotion id=prompt-decay
        q, k, v = self._split_qkv(self.qkv_proj(hidden_states).float())
        heads = torch.arange(self.num_v_heads, device=k.device) // (self.num_v_heads // self.num_heads)
        state = hidden_states.new_zeros(self.num_v_heads, self.head_v_dim, self.head_k_dim, dtype=torch.float32)
        deltas = []
        for t in range(num_tokens):
            k_t = k[t][heads]
            decayed = state * log_decay[t].float().exp()[:, None, :]
            delta = beta[t][:, None] * (v[t] - torch.einsum('hvk,hk->hv', decayed, k_t))
            state = decayed + delta[:, :, None] * k_t[:, None, :]
            deltas.append(delta)
        pad = (0, 0, 0, ring_len - num_tokens)
        cache = ReplayCache(
            state=hidden_states.new_zeros(self.num_v_heads, self.head_v_dim, self.head_k_dim),
            delta_cache=F.pad(torch.stack(deltas, dim=1), pad).to(hidden_states.dtype),
            key_cache=F.pad(k.transpose(0, 1), pad).to(hidden_states.dtype),
            gate_cache=F.pad(log_decay.transpose(0, 1), pad),
        )
        return cache, num_tokens


class KimiDecoderLayer(nn.Module):

    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype = None, device: torch.device = None):
        super().__init__()
        self.self_attn = KimiDeltaAttention(config, layer_idx, dtype=dtype, device=device)
        self.mlp = KimiMLP(config, dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)

    def forward(self, hidden_states: torch.Tensor, past_key_value: ReplayCache, attn_metadata: StepContext):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states), past_key_value, attn_metadata)
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class KimiLinearModel(nn.Module):

    def __init__(self, config: ModelConfig, dtype: torch.dtype = None, device: torch.device = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            [KimiDecoderLayer(config, idx, dtype=dtype, device=device) for idx in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)

    def forward(self, input_ids: torch.LongTensor, past_key_values: List[ReplayCache], attn_metadata: StepContext):
        hidden_states = self.embed_tokens(input_ids)
        for idx, decoder_layer in enumerate(self.layers):
            hidden_states = decoder_layer(hidden_states, past_key_values[idx], attn_metadata)
        return self.norm(hidden_states)


class KimiLinearForCausalLM(nn.Module):
    """Rewritten Kimi Linear causal LM."""

    stacked_params_mapping = [
        # (param_name, shard_name, shard_id)
        ('.qkv_proj', '.q_proj', 'q'),
        ('.qkv_proj', '.k_proj', 'k'),
        ('.qkv_proj', '.v_proj', 'v'),
        ('.gate_up_proj', '.gate_proj', 0),
        ('.gate_up_proj', '.up_proj', 1),
    ]

    def __init__(self,
                 config: ModelConfig,
                 ctx_mgr: StepContextManager,
                 dtype: torch.dtype = None,
                 device: torch.device = None):
        super().__init__()
        self.config = config
        self.ctx_mgr = ctx_mgr
        self.model = KimiLinearModel(config, dtype=dtype, device=device)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device)

    def forward(self, input_ids: torch.LongTensor, past_key_values: List[ReplayCache], attn_metadata: StepContext):
        return self.model(input_ids, past_key_values, attn_metadata)

    def get_logits(self, hidden_states: torch.Tensor):
        return self.lm_head(hidden_states).float()

    def get_attention(self, layer_idx: int) -> KimiDeltaAttention:
        return self.model.layers[layer_idx].self_attn

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        """Load weights (and buffers saved next to them)."""
        params_dict = dict(self.named_parameters())
        buffers_dict = dict(self.named_buffers())
        for name, loaded_weight in weights:
            if name in buffers_dict:
                load_buffer(self, name, loaded_weight)
                continue
            for param_name, weight_name, shard_id in self.stacked_params_mapping:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                load_weight(params_dict[name], loaded_weight, shard_id=shard_id)
                break
            else:
                load_weight(params_dict[name], loaded_weight)


class KimiLinearMTPModel(KimiLinearForCausalLM):
    """The draft model of MTP speculative decoding (same layers, fewer of them)."""


class KDAReplayCache(nn.Module):
    """Replay caches of every layer, kept as buffers of the model.

    Used by draft models and by engines started with ``cache_in_model=True``; otherwise the caches
    live in :class:`StateCacheEngine`. ``dtype`` is the dtype of the checkpoint states and the
    delta/key rings, ``None`` for the default dtype.
    """

    def __init__(self,
                 config: ModelConfig,
                 num_slots: int,
                 ring_len: int,
                 dtype: torch.dtype = None,
                 device: torch.device = None):
        super().__init__()
        self.ring_len = ring_len
        num_layers = config.num_layers
        shapes = config.get_replay_cache_shapes(num_slots, ring_len)
        self.register_buffer('state', torch.zeros(num_layers, *shapes.state, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer('delta_cache', torch.zeros(num_layers, *shapes.delta, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer('key_cache', torch.zeros(num_layers, *shapes.key, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer('gate_cache', torch.zeros(num_layers, *shapes.gate, device=device), persistent=False)  # expect-bug: default-dtype id=in-model-cache
        self.register_buffer('write_pos', torch.zeros(num_slots, dtype=torch.int32, device=device), persistent=False)

    @property
    def num_slots(self) -> int:
        return self.write_pos.size(0)

    def layer_caches(self) -> List[ReplayCache]:
        return [
            ReplayCache(self.state[idx], self.delta_cache[idx], self.key_cache[idx], self.gate_cache[idx])
            for idx in range(self.state.size(0))
        ]

    def resize_slots(self, num_slots: int):
        """Grow the caches to ``num_slots`` slots; existing slots keep their contents."""
        old_slots = self.num_slots
        if num_slots <= old_slots:
            return

        def _grown(old: torch.Tensor, new: torch.Tensor):
            new[:, :old_slots].copy_(old)
            return new

        num_layers = self.state.size(0)
        self.state = _grown(self.state, self.state.new_zeros(num_layers, num_slots, *self.state.shape[2:]))
        self.delta_cache = _grown(self.delta_cache,
                                  self.delta_cache.new_zeros(num_layers, num_slots, *self.delta_cache.shape[2:]))
        self.key_cache = _grown(self.key_cache,
                                self.key_cache.new_zeros(num_layers, num_slots, *self.key_cache.shape[2:]))
        self.gate_cache = _grown(self.gate_cache,  # expect-bug: like
                                 self.key_cache.new_zeros(num_layers, num_slots, *self.gate_cache.shape[2:]))
        write_pos = self.write_pos.new_zeros(num_slots)
        write_pos[:old_slots] = self.write_pos
        self.write_pos = write_pos


@torch.no_grad()
def decode_with_replay_cache(model: KimiLinearForCausalLM, input_ids: torch.Tensor, slots: torch.Tensor, steps: int,
                             flush_step: int = -1) -> torch.Tensor:
    """Greedy decode of ``steps`` tokens on the model's own replay caches; returns the hidden states."""
    cache = model.replay_cache
    hidden_states = []
    for step in range(steps):
        write_pos = cache.write_pos[slots.long()]
        force_flush = torch.full_like(slots, int(step == flush_step))
        inputs = ModelInputs(input_ids=input_ids, state_offsets=slots, write_pos=write_pos, force_flush=force_flush)
        caches = cache.layer_caches()
        ctx = model.ctx_mgr.build_context(inputs, model.config, caches)
        with model.ctx_mgr.context(ctx):
            hidden = model(input_ids, caches, ctx)
        input_ids = model.get_logits(hidden).argmax(-1)
        cache.write_pos[slots.long()] = next_write_pos(write_pos, cache.ring_len, force_flush)
        hidden_states.append(hidden)
    return torch.stack(hidden_states)


def _tiny_config(**kwargs) -> ModelConfig:
    config = dict(hidden_size=16, num_layers=2, num_attention_heads=2, num_value_heads=4, head_dim=8, v_head_dim=8,
                  vocab_size=32, intermediate_size=32, dtype=torch.bfloat16)
    config.update(kwargs)
    return ModelConfig(**config)


def build_kimi_linear_decode():
    """A bf16 Kimi Linear model with its own replay caches decoding four steps."""
    from .patch import get_patched_model
    torch.manual_seed(0)
    config = _tiny_config(lower_bound=-5.0)
    model = get_patched_model(config, device='cpu')
    model.load_weights(dummy_weights(config, seed=0))
    model.replay_cache = KDAReplayCache(config, num_slots=3, ring_len=4, dtype=config.dtype, device='cpu')
    hidden_states = decode_with_replay_cache(model, torch.tensor([3, 7]), torch.tensor([1, 0], dtype=torch.int32), 4,
                                             flush_step=1)
    return {'model': model, 'hidden_states': hidden_states}
