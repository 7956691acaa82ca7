"""Kimi Delta Attention mixer with ReplaySSM decode (cf. megatron/core/ssm/mamba_mixer.py)."""

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from mcore_kda.core.inference.contexts.static_context import KDAInferenceState
from mcore_kda.core.parallel_state import get_tensor_model_parallel_world_size
from mcore_kda.core.transformer.module import MegatronModule
from mcore_kda.core.transformer.spec_utils import ModuleSpec, build_module
from mcore_kda.core.transformer.transformer_config import TransformerConfig
from mcore_kda.core.utils import divide

from .replay_ops import kda_log_decay, kda_replay_decode, l2norm, replay_prefill


@dataclass
class KDAMixerSubmodules:
    """Contains the module specs for the input and output linear layers."""

    in_proj: Union[ModuleSpec, type] = None
    a_proj: Union[ModuleSpec, type] = None
    b_proj: Union[ModuleSpec, type] = None
    out_proj: Union[ModuleSpec, type] = None


class KDAMixer(MegatronModule):
    """Kimi Delta Attention.

    Projects the input to the packed ``mixed_qkv`` (q, k per key head; v per value head), the gate
    pre-activations ``a`` (per value head and key channel) and the ``beta`` logits, runs the delta
    rule with per-channel decays and projects back. Prompts run the recurrence directly; decode
    steps go through the ReplaySSM kernel on the states kept by the inference context.

    Args:
        config: The config of the model.
        submodules: Contains the module specs for the input and output linear layers.
        layer_number: The layer number of this KDA layer (1-based).
    """

    def __init__(self, config: TransformerConfig, submodules: KDAMixerSubmodules, layer_number: Optional[int] = None):
        super().__init__(config)
        self.config = config
        self.layer_number = layer_number
        self.tensor_model_parallel_size = get_tensor_model_parallel_world_size()
        self.num_k_heads_local = divide(config.linear_num_key_heads, self.tensor_model_parallel_size)
        self.num_v_heads_local = divide(config.linear_num_value_heads, self.tensor_model_parallel_size)
        self.k_head_dim = config.linear_key_head_dim
        self.v_head_dim = config.linear_value_head_dim
        self.ring_length = config.kda_ring_length
        self.lower_bound = config.kda_gate_lower_bound
        self.use_qk_l2norm = config.kda_use_qk_l2norm
        self.scale = self.k_head_dim**-0.5

        H, HV, K, V = config.linear_num_key_heads, config.linear_num_value_heads, self.k_head_dim, self.v_head_dim
        self.qkv_width_local = divide(2 * H * K + HV * V, self.tensor_model_parallel_size)
        self.in_proj = build_module(
            submodules.in_proj, config.hidden_size, 2 * H * K + HV * V, config=config,
            init_method=config.init_method, bias=False, gather_output=False,
        )
        self.a_proj = build_module(
            submodules.a_proj, config.hidden_size, HV * K, config=config,
            init_method=config.init_method, bias=False, gather_output=False,
        )
        self.b_proj = build_module(
            submodules.b_proj, config.hidden_size, HV, config=config,
            init_method=config.init_method, bias=True, gather_output=False,
        )

        # A_log and dt_bias are created in fp32 (cf. Mamba's A_log / dt_bias)
        A = torch.empty(self.num_v_heads_local, dtype=torch.float32).uniform_(1.0, 16.0)
        self.A_log = torch.nn.Parameter(torch.log(A))
        setattr(self.A_log, "tensor_model_parallel", True)
        dt = torch.exp(
            torch.rand(self.num_v_heads_local * K, dtype=torch.float32) * (math.log(0.1) - math.log(0.001))
            + math.log(0.001)
        ).clamp(min=1e-4)
        # Inverse of softplus: https://github.com/pytorch/pytorch/issues/72759
        self.dt_bias = torch.nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        setattr(self.dt_bias, "tensor_model_parallel", True)

        self.out_proj = build_module(
            submodules.out_proj, HV * V, config.hidden_size, config=config,
            init_method=config.output_layer_init_method, bias=False, input_is_parallel=True,
        )
        self._resident_states = False
        if config.kda_resident_inference_state:
            self.register_resident_states(config.inference_max_batch_size)

    # ---- state allocation ---------------------------------------------------------------

    def register_resident_states(self, max_batch_size: int) -> None:
        """Keep this layer's decode state in module buffers for up to ``max_batch_size`` sequences."""
        cfg = self.config
        HV, H, K, V, L = self.num_v_heads_local, self.num_k_heads_local, self.k_head_dim, self.v_head_dim, self.ring_length
        self.register_buffer(
            "ssm_state", torch.zeros(max_batch_size, HV, V, K, dtype=cfg.kda_checkpoint_dtype), persistent=False
        )
        self.register_buffer("delta_ring", torch.zeros(max_batch_size, HV, L, V, dtype=cfg.params_dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros(max_batch_size, H, L, K, dtype=cfg.params_dtype), persistent=False)
        self.register_buffer("gate_ring", torch.zeros(max_batch_size, HV, L, K), persistent=False)  # expect-bug: default-dtype id=build-default
        # Float16Module casts every buffer; these come back in fp32 (see restore_fp32_buffers)
        fp32_names = ["gate_ring"]
        if cfg.kda_checkpoint_dtype == torch.float32:
            fp32_names.append("ssm_state")
        self._fp32_buffer_names = tuple(fp32_names)
        self._resident_states = True

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None):
        """Static decode buffers of this layer for ``batch_size`` sequences.

        ``max_seqlen`` is unused: the state of a KDA layer does not grow with the sequence.
        """
        del max_seqlen
        device = self.out_proj.weight.device
        dtype = self.in_proj.weight.dtype if dtype is None else dtype
        HV, H, K, V, L = self.num_v_heads_local, self.num_k_heads_local, self.k_head_dim, self.v_head_dim, self.ring_length
        ssm_state = torch.zeros(batch_size, HV, V, K, device=device, dtype=self.config.kda_checkpoint_dtype)
        delta_ring = torch.zeros(batch_size, HV, L, V, device=device, dtype=dtype)
        key_ring = torch.zeros(batch_size, H, L, K, device=device, dtype=dtype)
        gate_ring = torch.zeros(batch_size, HV, L, K, device=device, dtype=dtype)  # expect-bug: pool-dtype
        return KDAInferenceState(ssm_state, delta_ring, key_ring, gate_ring)

    def resident_states(self, batch_size: int) -> KDAInferenceState:
        return KDAInferenceState(
            self.ssm_state[:batch_size], self.delta_ring[:batch_size], self.key_ring[:batch_size],
            self.gate_ring[:batch_size],
        )

    def _get_states_from_cache(self, inference_context, batch_size: int) -> Optional[KDAInferenceState]:
        if self._resident_states:
            return self.resident_states(batch_size)
        return inference_context.key_value_memory_dict.get(self.layer_number)

    # ---- forward ------------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, inference_context=None) -> torch.Tensor:
        """hidden_states: [s, b, h] -> [s, b, h]"""
        seqlen, batch, _ = hidden_states.shape
        mixed_qkv, _ = self.in_proj(hidden_states)
        a, _ = self.a_proj(hidden_states)
        beta_logits, _ = self.b_proj(hidden_states)
        if inference_context is not None and inference_context.is_decode_only():
            assert seqlen == 1, "decode steps take one token per sequence"
            core_out = self._decode(mixed_qkv[0], a[0], beta_logits[0], inference_context).unsqueeze(0)
        else:
            core_out = self._prefill(mixed_qkv, a, beta_logits, inference_context)
        core_out = core_out.reshape(seqlen, batch, -1).to(hidden_states.dtype)
        out, _ = self.out_proj(core_out)
        return out

    def _split_qkv(self, mixed_qkv: torch.Tensor):
        H, HV, K, V = self.num_k_heads_local, self.num_v_heads_local, self.k_head_dim, self.v_head_dim
        q, k, v = torch.split(mixed_qkv, [H * K, H * K, HV * V], dim=-1)
        return (
            q.reshape(*q.shape[:-1], H, K),
            k.reshape(*k.shape[:-1], H, K),
            v.reshape(*v.shape[:-1], HV, V),
        )

    def _log_decay(self, a: torch.Tensor) -> torch.Tensor:
        """Per-channel log-decays ``[s, b, HV, K]`` of every prompt token."""
        a = a.reshape(*a.shape[:-1], self.num_v_heads_local, self.k_head_dim)
        dt_bias = self.dt_bias.reshape(self.num_v_heads_local, self.k_head_dim)
        if self.lower_bound is not None:
            return kda_log_decay(a, self.A_log, dt_bias, self.lower_bound)
        # unbounded gate, fused: saves the fp32 copy of ``a`` over the whole prompt
        return -torch.exp(self.A_log)[:, None] * F.softplus(a + dt_bias)  # expect-bug: promotion

    def _prefill(self, mixed_qkv, a, beta_logits, inference_context):
        seqlen, batch = mixed_qkv.shape[:2]
        q, k, v = self._split_qkv(mixed_qkv.float())
        if self.use_qk_l2norm:
            q, k = l2norm(q), l2norm(k)
        g = self._log_decay(a)
        beta = torch.sigmoid(beta_logits).float()
        state_dtype = self.config.kda_checkpoint_dtype
        if inference_context is not None and inference_context.is_dynamic_batching():
            state_dtype = inference_context.kda_state_config.state_dtype
        outputs, states, write_pos = replay_prefill(
            q * self.scale, k, v, g, beta, self.ring_length, state_dtype=state_dtype, ring_dtype=mixed_qkv.dtype
        )
        if inference_context is None:
            return outputs
        new_states = KDAInferenceState(*states)
        if inference_context.is_static_batching():
            cache = self._get_states_from_cache(inference_context, batch)
            if cache is None:
                inference_context.key_value_memory_dict[self.layer_number] = new_states
            else:
                # buffers allocated up front (resident or captured into a graph): keep their addresses
                for dst, src in zip(cache, new_states):
                    dst.copy_(src)
            inference_context.kda_write_pos = torch.full((batch,), write_pos, dtype=torch.int32)
        else:
            assert batch == 1, "the dynamic context prefills one request at a time"
            slot = inference_context.prefill_slot
            pool = inference_context.kda_layer_states(self.layer_number)
            for dst, src in zip(pool, new_states):
                dst[slot] = src[0]
            inference_context.kda_write_pos[slot] = write_pos
        return outputs

    def _decode(self, mixed_qkv, a, beta_logits, inference_context) -> torch.Tensor:
        """One token per sequence: [b, W] -> [b, HV, V]"""
        batch = mixed_qkv.shape[0]
        if inference_context.is_static_batching():
            states = self._get_states_from_cache(inference_context, batch)
            slots = torch.arange(batch, dtype=torch.int32, device=mixed_qkv.device)
            write_pos = inference_context.kda_write_pos
            runner = inference_context.decode_graph_runners.get(self.layer_number)
            if runner is not None:
                return runner.replay(mixed_qkv, a, beta_logits, slots, write_pos)[:, 0]
        else:
            states = inference_context.kda_layer_states(self.layer_number)
            slots = inference_context.active_slots
            write_pos = inference_context.kda_write_pos[slots.long()]
        out = mixed_qkv.new_empty(batch, 1, self.num_v_heads_local, self.v_head_dim)
        kda_replay_decode(
            mixed_qkv, a, beta_logits, self.A_log, self.dt_bias, self.scale,
            states.ssm_state, states.delta_ring, states.key_ring, states.gate_ring, out,
            slots, write_pos, None, self.use_qk_l2norm, self.lower_bound,
        )
        return out[:, 0]
