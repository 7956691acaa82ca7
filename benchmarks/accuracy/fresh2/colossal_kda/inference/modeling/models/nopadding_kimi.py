# This code is adapted from the nopadding llama modeling of the inference engine.
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from torch.distributed import ProcessGroup

from colossal_kda.inference.config import ModelShardInferenceConfig
from colossal_kda.kernel.kernel_loader import LAST_CALL, InferenceOpsLoader

from .kimi_linear import KimiDeltaAttention, KimiLinearConfig, KimiLinearForCausalLM

inference_ops = InferenceOpsLoader().load()


def kimi_linear_causal_lm_forward(self: KimiLinearForCausalLM, input_tokens_ids: torch.Tensor, batch: "BatchBucket" = None,
                                  kv_cache_manager: "KVCacheManager" = None,
                                  kda_rings: Optional[List[Tuple[torch.Tensor, ...]]] = None) -> torch.Tensor:
    """This function will replace the forward function of KimiLinearForCausalLM.

    Args:
        input_tokens_ids (torch.Tensor): one token per running sequence, shape [batch_size].
        batch (BatchBucket): It stores the necessary input information for this inference. None for
            models whose KDA layers own their state (drafters).
        kv_cache_manager (KVCacheManager): pool of the KDA states, indexed by the slots of `batch`.
        kda_rings (List[Tuple[torch.Tensor, ...]], optional): per KDA layer (state, d, k, g) to decode
            from instead of the pool, e.g. the static inputs of a captured CUDA graph.
    """
    kda_slots, kda_write_pos = (None, None) if batch is None else batch.get_kda_inputs()
    hidden_states = self.model.embed_tokens(input_tokens_ids)
    for layer in self.model.layers:
        residual = hidden_states
        hidden_states = layer.input_layernorm(hidden_states)
        if isinstance(layer.self_attn, NopadKimiDeltaAttention):
            rings = None if kda_rings is None else kda_rings[layer.self_attn.kda_layer_idx]
            hidden_states = layer.self_attn(hidden_states, kda_slots, kda_write_pos, kv_cache_manager, rings=rings)
        else:
            hidden_states = layer.self_attn(hidden_states.unsqueeze(1)).squeeze(1)
        hidden_states = residual + hidden_states
    return self.lm_head(self.model.norm(hidden_states))


class NopadKimiDeltaAttention(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int, qkv_weight: torch.Tensor, f_weight: torch.Tensor,
                 b_weight: torch.Tensor, o_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                 model_shard_infer_config: ModelShardInferenceConfig = None, process_group: ProcessGroup = None):
        """This layer will replace the KimiDeltaAttention.

        Args:
            config (KimiLinearConfig): Holding the KimiLinear model config.
            layer_idx (int): The decode layer id of this attention layer.
            qkv_weight (torch.Tensor): The fused q, k, v projection weight.
            f_weight, b_weight, o_weight (torch.Tensor): The gate, beta and output projection weights.
            A_log, dt_bias (torch.Tensor): The decay parameters.
            model_shard_infer_config (ModelShardInferenceConfig): inference options of the shard.
        """
        super().__init__()
        self.layer_idx = layer_idx
        self.kda_layer_idx = config.kda_layer_idx.index(layer_idx)
        self.num_heads, self.num_v_heads, self.head_dim = H, HV, K = (
            config.kda_num_heads, config.kda_num_v_heads, config.kda_head_dim)
        self.scale = K**-0.5
        self.lower_bound = config.kda_lower_bound
        self.process_group = process_group

        self.qkv_weight = nn.Parameter(qkv_weight)
        self.f_weight = nn.Parameter(f_weight)
        self.b_weight = nn.Parameter(b_weight)
        self.o_weight = nn.Parameter(o_weight)
        self.A_log = nn.Parameter(A_log)
        self.dt_bias = nn.Parameter(dt_bias)

        if model_shard_infer_config is not None and model_shard_infer_config.standalone_state:
            # Used without a KVCacheManager (e.g. as drafter): the module owns a one-slot state
            L, dev, dtype = model_shard_infer_config.kda_ring_len, qkv_weight.device, qkv_weight.dtype
            self.register_buffer("state_buf", torch.zeros(1, HV, K, K, dtype=torch.float32, device=dev), persistent=False)
            self.register_buffer("d_buf", torch.zeros(1, HV, L, K, dtype=dtype, device=dev), persistent=False)
            self.register_buffer("k_buf", torch.zeros(1, H, L, K, dtype=dtype, device=dev), persistent=False)
            self.register_buffer("log_gate_buf", torch.zeros(1, HV, L, K, dtype=torch.float32, device=dev), persistent=False)
            self.register_buffer("pos_buf", torch.zeros(1, dtype=torch.int32, device=dev), persistent=False)

    @staticmethod
    def from_native_module(module: KimiDeltaAttention, *args, **kwargs) -> "NopadKimiDeltaAttention":
        """Used for initialize the weight of NopadKimiDeltaAttention by origin KimiDeltaAttention.

        Args:
            module (KimiDeltaAttention): The origin KimiDeltaAttention layer.
        """
        qkv_weight = torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight], dim=0)
        return NopadKimiDeltaAttention(
            config=module.config,
            layer_idx=module.layer_idx,
            qkv_weight=qkv_weight.detach(),
            f_weight=module.f_proj.weight.detach(),
            b_weight=module.b_proj.weight.detach(),
            o_weight=module.o_proj.weight.detach(),
            A_log=module.A_log.detach(),
            dt_bias=module.dt_bias.detach(),
            model_shard_infer_config=kwargs.get("model_shard_infer_config", None),
            process_group=kwargs.get("process_group", None),
        )

    def forward(self, hidden_states: torch.Tensor, kda_slots: Optional[torch.Tensor], kda_write_pos: Optional[torch.Tensor],
                kv_cache_manager: "KVCacheManager" = None, rings: Optional[Tuple[torch.Tensor, ...]] = None) -> torch.Tensor:
        """
        Args:
            hidden_states (torch.Tensor): input of shape [batch_size, hidden_size], one token per sequence.
            kda_slots (torch.Tensor): int32 state slot of every sequence.
            kda_write_pos (torch.Tensor): int32 ring cursor of every sequence.
            kv_cache_manager (KVCacheManager, optional): owner of the state pool.
            rings (Tuple[torch.Tensor, ...], optional): (state, d, k, g) to use instead of the pool.
        """
        bsz = hidden_states.size(0)
        if rings is not None:
            state, d_cache, k_cache, g_cache = rings
        elif kv_cache_manager is not None:
            state, d_cache, k_cache, g_cache = kv_cache_manager.get_kda_cache(self.kda_layer_idx)
        else:
            state, d_cache, k_cache, g_cache = self.state_buf, self.d_buf, self.k_buf, self.log_gate_buf
            kda_slots = torch.zeros(bsz, dtype=torch.int32, device=hidden_states.device)
            kda_write_pos = self.pos_buf

        out = torch.empty(bsz, self.num_v_heads, self.head_dim, dtype=hidden_states.dtype, device=hidden_states.device)
        inference_ops.kda_replayssm_decode(
            hidden_states @ self.qkv_weight.T, hidden_states @ self.f_weight.T, hidden_states @ self.b_weight.T,
            self.A_log, self.dt_bias, self.scale, state, d_cache, k_cache, g_cache, out, kda_slots, kda_write_pos,
            None, True, self.lower_bound,
        )
        return out.view(bsz, -1) @ self.o_weight.T


def build_standalone_layer():
    native = KimiLinearForCausalLM(KimiLinearConfig(), dtype=torch.bfloat16)
    shard_config = ModelShardInferenceConfig(dtype=torch.bfloat16, kda_ring_len=4, standalone_state=True)
    layer = NopadKimiDeltaAttention.from_native_module(native.model.layers[0].self_attn, model_shard_infer_config=shard_config)
    layer(torch.ones(1, 32, dtype=torch.bfloat16), None, None)
    return {"layer": layer, "decode": dict(LAST_CALL)}
