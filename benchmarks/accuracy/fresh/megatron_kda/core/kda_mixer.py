import logging
from typing import Any

import torch
import torch.nn.functional as F

from megatron_kda.core.inference_params import InferenceParams, KDAState, named_states
from megatron_kda.core.module import MegatronModule
from megatron_kda.core.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)

LAST_CALL: dict[str, Any] = {}


def fused_kda_replayssm_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    d_cache,
    k_cache,
    g_cache,
    out,
    ssm_state_indices,
    write_pos,
    force_flush=None,
    use_qk_l2norm_in_kernel=False,
    lower_bound=None,
):
    """CPU stand-in of the fused ReplaySSM decode kernel: records its state arguments."""
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    LAST_CALL.update(ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    return out.zero_(), initial_state


class KDAMixer(MegatronModule):
    """Kimi Delta Attention token mixer with ReplaySSM decode state.

    Args:
        config (TransformerConfig): The config of the transformer model.
        layer_number (int): 1-based index of the layer, the key of its inference state.
    """

    def __init__(self, config: TransformerConfig, layer_number: int):
        super().__init__(config)
        self.layer_number = layer_number
        self.num_heads = h = config.kda_num_heads
        self.num_k_heads = hk = config.kda_num_k_heads
        self.head_dim = d = config.kda_head_dim
        n = config.replay_ring_len
        # q, k, v | gate logits | beta
        self.split_sizes = [(2 * hk + h) * d, h * d, h]
        dtype = config.params_dtype
        self.in_proj = torch.nn.Linear(
            config.hidden_size, sum(self.split_sizes), False, dtype=dtype
        )
        self.out_proj = torch.nn.Linear(h * d, config.hidden_size, bias=False, dtype=dtype)
        A = torch.empty(h, dtype=torch.float32).uniform_(1, 16)
        self.A_log = torch.nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.dt_bias = torch.nn.Parameter(torch.zeros(h * d, dtype=torch.float32))
        normalizer = torch.tensor(config.kda_gate_logit_normalizer)
        self.register_buffer("gate_logit_normalizer", normalizer, persistent=False)
        if config.static_replay_cache:
            self.register_buffer("static_ssm_state", torch.zeros(1, h, d, d, dtype=torch.float32))
            self.register_buffer("static_d_cache", torch.zeros(1, h, n, d, dtype=dtype))
            self.register_buffer("static_k_cache", torch.zeros(1, hk, n, d, dtype=dtype))
            self.register_buffer("static_g_cache", torch.zeros(1, h, n, d, dtype=torch.float32))

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype=None) -> KDAState:
        n, h, hk, d = self.config.replay_ring_len, self.num_heads, self.num_k_heads, self.head_dim
        ring_dtype = self.config.replay_ring_dtype if dtype is None else dtype
        gate_dtype = self.config.replay_gate_dtype
        ssm_state = torch.zeros(batch_size, h, d, d, dtype=torch.float32)
        d_cache = torch.zeros(batch_size, h, n, d, dtype=ring_dtype)
        k_cache = torch.zeros(batch_size, hk, n, d, dtype=ring_dtype)
        g_cache = torch.zeros(  # expect-bug: imported-policy id=mg-replay-dtypes
            batch_size, h, n, d, dtype=gate_dtype
        )
        return ssm_state, d_cache, k_cache, g_cache

    def _log_decay(self, gate_logits: torch.Tensor) -> torch.Tensor:
        gate_logits = gate_logits.unflatten(-1, (self.num_heads, self.head_dim))
        if self.config.kda_gate_type == "logsigmoid":
            return F.logsigmoid(gate_logits) / self.gate_logit_normalizer  # expect-bug: promotion
        A = self.A_log.float().exp()[:, None]
        dt_bias = self.dt_bias.float().view(self.num_heads, self.head_dim)
        return -A * F.softplus(gate_logits.float() + dt_bias)

    def _states_from_prompt(self, k, d, log_decay) -> KDAState:
        """Seeds the rings with the prompt's last ``replay_ring_len`` steps ([s, b, heads, dim])."""
        n, batch, h, dim = self.config.replay_ring_len, d.shape[1], self.num_heads, self.head_dim
        ssm_state = torch.zeros(batch, h, dim, dim, dtype=torch.float32)
        d_cache = d[-n:].permute(1, 2, 0, 3).contiguous()
        k_cache = k[-n:].permute(1, 2, 0, 3).contiguous()
        g_cache = log_decay[-n:].permute(1, 2, 0, 3).contiguous()
        return ssm_state, d_cache, k_cache, g_cache

    def static_states(self) -> KDAState:
        return self.static_ssm_state, self.static_d_cache, self.static_k_cache, self.static_g_cache

    def forward(self, hidden_states, inference_params=None, replay_states=None) -> torch.Tensor:
        if replay_states is None and inference_params is None and self.config.static_replay_cache:
            replay_states = self.static_states()
        if inference_params is not None and inference_params.sequence_len_offset > 0:
            replay_states = inference_params.key_value_memory_dict[self.layer_number]
        if replay_states is not None:
            return self._decode_step(hidden_states, replay_states)

        qkv, gate_logits, beta = self.in_proj(hidden_states).split(self.split_sizes, dim=-1)
        k_size = self.num_k_heads * self.head_dim
        k = qkv[..., k_size : 2 * k_size].unflatten(-1, (self.num_k_heads, self.head_dim))
        v = qkv[..., 2 * k_size :].unflatten(-1, (self.num_heads, self.head_dim))
        d = v * torch.sigmoid(beta)[..., None]
        if inference_params is not None:
            states = self._states_from_prompt(k, d, self._log_decay(gate_logits))
            inference_params.key_value_memory_dict[self.layer_number] = states
        return self.out_proj(d.flatten(-2))

    def _decode_step(self, hidden_states: torch.Tensor, states: KDAState) -> torch.Tensor:
        ssm_state, d_cache, k_cache, g_cache = states
        batch = hidden_states.shape[1]
        qkv, gate_logits, beta = self.in_proj(hidden_states[-1]).split(self.split_sizes, dim=-1)
        out = hidden_states.new_empty(batch, self.num_heads, self.head_dim)
        fused_kda_replayssm_decode(
            qkv,
            gate_logits,
            beta,
            self.A_log,
            self.dt_bias,
            self.head_dim**-0.5,
            ssm_state,
            d_cache,
            k_cache,
            g_cache,
            out,
            torch.arange(batch, dtype=torch.int32),
            torch.zeros(batch, dtype=torch.int32),
            use_qk_l2norm_in_kernel=True,
        )
        return self.out_proj(out.flatten(-2))[None]


class KimiHybridModel(MegatronModule):
    def __init__(
        self, config: TransformerConfig, pre_process: bool = True, post_process: bool = True
    ):
        super().__init__(config)
        self.pre_process = pre_process
        self.post_process = post_process
        h, vocab, dtype = config.hidden_size, config.padded_vocab_size, config.params_dtype
        self.embedding = torch.nn.Embedding(vocab, h, dtype=dtype)
        self.layers = torch.nn.ModuleList(
            [KDAMixer(config, i + 1) for i in range(config.num_layers)]
        )
        self.final_norm = torch.nn.LayerNorm(h, dtype=dtype)
        self.output_layer = torch.nn.Linear(h, vocab, bias=False, dtype=dtype)

    def forward(
        self, input_ids, position_ids, attention_mask, replay_states=None, inference_params=None
    ):
        hidden_states = self.embedding(input_ids).transpose(0, 1).contiguous()  # [s, b, h]
        for i, layer in enumerate(self.layers):
            states = None if replay_states is None else replay_states[i]
            hidden_states = hidden_states + layer(hidden_states, inference_params, states)
        if inference_params is not None:
            inference_params.sequence_len_offset += input_ids.shape[1]
        return self.output_layer(self.final_norm(hidden_states)).transpose(0, 1)


def _prompt_states(config: TransformerConfig) -> InferenceParams:
    model = KimiHybridModel(config)
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    tokens = torch.arange(10).view(2, 5)
    model(tokens, torch.arange(5).expand(2, 5), None, inference_params=params)
    model(tokens[:, -1:], torch.full((2, 1), 5), None, inference_params=params)
    return params


def build_prompt_states() -> dict[str, Any]:
    config = TransformerConfig(num_layers=2, hidden_size=8, bf16=True, params_dtype=torch.bfloat16)
    return {"states": named_states(_prompt_states(config)), "last_call": dict(LAST_CALL)}


def build_prompt_states_logsigmoid_gate() -> dict[str, Any]:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=8,
        bf16=True,
        params_dtype=torch.bfloat16,
        kda_gate_type="logsigmoid",
    )
    return {"states": named_states(_prompt_states(config)), "last_call": dict(LAST_CALL)}
