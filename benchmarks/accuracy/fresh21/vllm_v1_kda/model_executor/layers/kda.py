"""Kimi Delta Attention with ReplaySSM decode (vllm/model_executor/layers/kda.py)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm_v1_kda.config import CacheConfig, KimiLinearConfig, ModelConfig, get_current_vllm_config
from vllm_v1_kda.forward_context import get_forward_context
from vllm_v1_kda.model_executor.layers.fla.ops.kda_replay import advance_write_pos, replay_ssm_decode
from vllm_v1_kda.model_executor.layers.mamba.mamba_utils import (
    MambaBase,
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm_v1_kda.model_executor.model_loader.weight_utils import default_weight_loader, set_weight_attrs
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayBackend, KDAReplayMetadata, KDAReplayState


def kda_attention(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    """What ``torch.ops.vllm.kda_attention`` dispatches to: the layer is looked up by name so
    that the compiled graph does not capture it."""
    forward_context = get_forward_context()
    self = forward_context.no_compile_layers[layer_name]
    self._forward(hidden_states=hidden_states, output=output)


class KimiDeltaAttention(nn.Module, MambaBase):
    @property
    def mamba_type(self) -> str:
        return "kda_replay"

    def get_attn_backend(self) -> type[KDAReplayBackend]:
        return KDAReplayBackend

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return MambaStateDtypeCalculator.kda_replay_state_dtype(
            self.model_config.dtype,
            self.cache_config.mamba_cache_dtype,
            self.cache_config.mamba_ssm_cache_dtype,
        )

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return MambaStateShapeCalculator.kda_replay_state_shape(
            self.tp_size, self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim, self.ring_len
        )

    def __init__(
        self,
        layer_idx: int,
        hidden_size: int,
        config: KimiLinearConfig,
        cache_config: Optional[CacheConfig] = None,
        model_config: Optional[ModelConfig] = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        vllm_config = get_current_vllm_config()
        self.model_config = model_config or vllm_config.model_config
        self.cache_config = cache_config or vllm_config.cache_config
        self.layer_idx = layer_idx
        self.hidden_size = hidden_size
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        lin = config.linear_attn_config
        self.num_heads = lin["num_heads"]
        self.num_v_heads = lin.get("num_v_heads", self.num_heads)
        self.head_k_dim = lin["head_dim"]
        self.head_v_dim = lin.get("head_v_dim", self.head_k_dim)
        self.lower_bound: Optional[float] = lin.get("gate_lower_bound")
        self.ring_len = self.cache_config.kda_ring_len
        self.scale = self.head_k_dim**-0.5
        projection_k = self.num_heads * self.head_k_dim
        projection_v = self.num_v_heads * self.head_v_dim

        self.q_proj = nn.Linear(hidden_size, projection_k, bias=False)
        self.k_proj = nn.Linear(hidden_size, projection_k, bias=False)
        self.v_proj = nn.Linear(hidden_size, projection_v, bias=False)
        # low-rank gate projection: hidden -> head_k_dim -> HV * K
        self.f_a_proj = nn.Linear(hidden_size, self.head_k_dim, bias=False)
        self.f_b_proj = nn.Linear(self.head_k_dim, self.num_v_heads * self.head_k_dim, bias=False)
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        # the decay parameters stay fp32 whatever the model dtype (the kernel reads them as fp32)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads * self.head_k_dim, dtype=torch.float32))
        set_weight_attrs(self.A_log, {"weight_loader": default_weight_loader})
        set_weight_attrs(self.dt_bias, {"weight_loader": default_weight_loader})
        self.o_proj = nn.Linear(projection_v, hidden_size, bias=False)

        compilation_config = vllm_config.compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self
        self.prefix = prefix
        self.kv_sharing_target_layer_name: Optional[str] = None
        # The outer list is for v0 PP virtual engine; bound by bind_kv_cache.
        self.kv_cache = [(torch.tensor([]),) * 4 for _ in range(vllm_config.parallel_config.pipeline_parallel_size)]

    def process_weights_after_loading(self) -> None:
        # checkpoints store A_log/dt_bias in bf16 next to the rest; the parameters keep fp32
        self.A_log.data = self.A_log.data.float()
        self.dt_bias.data = self.dt_bias.data.float()

    def forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> None:
        kda_attention(hidden_states, output, self.prefix)

    def _project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mixed_qkv = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
        # raw gate input; the kernel adds dt_bias and computes the log-decay in fp32
        a = self.f_b_proj(self.f_a_proj(hidden_states))
        b = self.b_proj(hidden_states)
        return mixed_qkv, a, b

    def _forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> None:
        forward_context = get_forward_context()
        attn_metadata = forward_context.attn_metadata
        if attn_metadata is None:
            # profile run without caches
            output.zero_()
            return
        metadata: KDAReplayMetadata = attn_metadata[self.prefix]
        cache = KDAReplayState(*self.kv_cache[forward_context.virtual_engine])
        num_reqs = metadata.num_reqs
        hidden_states = hidden_states[:num_reqs]
        mixed_qkv, a, b = self._project(hidden_states)
        core_attn_out = torch.empty(
            (num_reqs, 1, self.num_v_heads, self.head_v_dim), dtype=hidden_states.dtype, device=hidden_states.device
        )
        replay_ssm_decode(
            mixed_qkv,
            a,
            b,
            self.A_log,
            self.dt_bias,
            self.scale,
            initial_state=cache.state,
            d_cache=cache.d_cache,
            k_cache=cache.k_cache,
            g_cache=cache.g_cache,
            out=core_attn_out,
            ssm_state_indices=metadata.state_indices_tensor,
            write_pos=metadata.write_pos,
            force_flush=metadata.force_flush,
            use_qk_l2norm_in_kernel=True,
            lower_bound=self.lower_bound,
        )
        output[:num_reqs] = self.o_proj(core_attn_out.view(num_reqs, -1))

    def forward_verify(
        self, hidden_states: torch.Tensor, output: torch.Tensor, num_tokens_per_req: int
    ) -> torch.Tensor:
        """Spec-decode verification: the draft tokens of each request go through the kernel
        one after another (the fused multi-token kernel is not written yet).

        Returns the cursors after the last token; the runner keeps them if all are accepted.
        """
        forward_context = get_forward_context()
        metadata: KDAReplayMetadata = forward_context.attn_metadata[self.prefix]
        cache = KDAReplayState(*self.kv_cache[forward_context.virtual_engine])
        num_reqs = metadata.num_reqs
        write_pos = metadata.write_pos.clone()
        for step in range(num_tokens_per_req):
            rows = hidden_states[step::num_tokens_per_req][:num_reqs]
            mixed_qkv, a, b = self._project(rows)
            core_attn_out = torch.empty(
                (num_reqs, 1, self.num_v_heads, self.head_v_dim), dtype=rows.dtype, device=rows.device
            )
            replay_ssm_decode(  # expect-bug: decode-arg
                mixed_qkv,
                a,
                b,
                self.A_log,
                self.dt_bias,
                self.scale,
                initial_state=cache.state,
                d_cache=cache.d_cache,
                k_cache=cache.k_cache,
                g_cache=cache.g_cache.to(mixed_qkv.dtype),
                out=core_attn_out,
                ssm_state_indices=metadata.state_indices_tensor,
                write_pos=write_pos,
                use_qk_l2norm_in_kernel=True,
                lower_bound=self.lower_bound,
            )
            output[step::num_tokens_per_req][:num_reqs] = self.o_proj(core_attn_out.view(num_reqs, -1))
            write_pos = advance_write_pos(write_pos, self.ring_len).to(torch.int32)
        return write_pos

    def materialize_state(self, cache: KDAReplayState, slot: int, cursor: int) -> torch.Tensor:
        """The state of ``slot`` after its ring rows before ``cursor`` ([HV, V, K], fp32).

        Chunked prefill continues a request from this state, then writes the result as the new
        checkpoint and restarts the ring at 0.
        """
        state = cache.state[slot].float()
        if cursor == 0:
            return state
        heads = torch.arange(self.num_v_heads, device=state.device) // (self.num_v_heads // self.num_heads)
        gates = cache.g_cache[slot, :, :cursor].to(cache.state.dtype)  # expect-bug: cast
        prefix = gates.cumsum(dim=1).float()
        total = prefix[:, -1]
        decay = (total[:, None, :] - prefix).exp() * cache.k_cache[slot, heads, :cursor].float()
        return state * total.exp()[:, None, :] + torch.einsum(
            "hcv,hck->hvk", cache.d_cache[slot, :, :cursor].float(), decay
        )
