"""KimiDeltaAttention decode path: reads its bound state and calls the ReplaySSM kernel."""

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import ops
from .cache import HEAD_K, HEAD_V, HEADS, RING, SLOTS, VALUE_HEADS, LayerStates
from .config import CacheConfig


@dataclass
class KDAAttentionMetadata:
    num_decodes: int
    state_indices_tensor: torch.Tensor
    write_pos_tensor: torch.Tensor
    force_flush_tensor: torch.Tensor | None = None


class KimiDeltaAttention(nn.Module):
    def __init__(self, cache_config: CacheConfig, model_dtype: torch.dtype, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix
        self.cache_config = cache_config
        self.model_dtype = model_dtype
        self.A_log = nn.Parameter(torch.linspace(-2.0, 0.0, VALUE_HEADS))
        self.dt_bias = nn.Parameter(torch.zeros(VALUE_HEADS, HEAD_K))
        self.scale = HEAD_K**-0.5
        self.kv_cache: LayerStates | None = None

    def _inputs(self, num_decodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = 2 * HEADS * HEAD_K + VALUE_HEADS * HEAD_V
        mixed_qkv = torch.randn(num_decodes, width, dtype=self.model_dtype)
        a = torch.randn(num_decodes, VALUE_HEADS, HEAD_K, dtype=self.model_dtype)
        b = torch.randn(num_decodes, VALUE_HEADS, dtype=self.model_dtype)
        return mixed_qkv, a, b

    def forward_decode(self, meta: KDAAttentionMetadata) -> torch.Tensor:
        assert self.kv_cache is not None
        states = self.kv_cache
        mixed_qkv, a, b = self._inputs(meta.num_decodes)
        out = torch.empty(meta.num_decodes, 1, VALUE_HEADS, HEAD_V, dtype=self.model_dtype)
        ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv,
            a,
            b,
            self.A_log,
            self.dt_bias,
            self.scale,
            states.ssm_state,
            states.d_ring,
            states.k_ring,
            states.g_ring,
            out,
            meta.state_indices_tensor,
            meta.write_pos_tensor,
            force_flush=meta.force_flush_tensor,
            use_qk_l2norm_in_kernel=True,
        )
        return out

    def forward_decode_cudagraph(self, meta: KDAAttentionMetadata) -> torch.Tensor:
        # The captured graph reads the rings through static buffers of the kernel's dtype.
        assert self.kv_cache is not None
        states = self.kv_cache
        mixed_qkv, a, b = self._inputs(meta.num_decodes)
        g_ring = states.g_ring.to(mixed_qkv.dtype)  # expect-bug: cast
        out = torch.empty(meta.num_decodes, 1, VALUE_HEADS, HEAD_V, dtype=self.model_dtype)
        ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, states.ssm_state,
            states.d_ring, states.k_ring, g_ring, out,
            meta.state_indices_tensor, meta.write_pos_tensor,
        )
        return out

    def forward_decode_kwargs(self, meta: KDAAttentionMetadata) -> torch.Tensor:
        assert self.kv_cache is not None
        states = self.kv_cache
        mixed_qkv, a, b = self._inputs(meta.num_decodes)
        out = torch.empty(meta.num_decodes, 1, VALUE_HEADS, HEAD_V, dtype=self.model_dtype)
        kernel_kwargs: dict[str, Any] = dict(
            initial_state=states.ssm_state,
            d_cache=states.d_ring,
            k_cache=states.k_ring,
            g_cache=states.g_ring.to(torch.float32),
            ssm_state_indices=meta.state_indices_tensor,
            write_pos=meta.write_pos_tensor,
        )
        ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, out=out, **kernel_kwargs
        )
        return out


def dummy_decode_states(model_dtype: torch.dtype, num_slots: int) -> LayerStates:
    """Placeholder state for the profile run, before the real KV cache is allocated."""
    conv_state = torch.zeros(num_slots, 3, 2 * HEADS * HEAD_K + VALUE_HEADS * HEAD_V, dtype=model_dtype)
    ssm_state = torch.zeros(num_slots, VALUE_HEADS, HEAD_V, HEAD_K, dtype=model_dtype)
    d_ring = torch.zeros(num_slots, VALUE_HEADS, RING, HEAD_V, dtype=model_dtype)
    k_ring = torch.zeros(num_slots, HEADS, RING, HEAD_K, dtype=model_dtype)
    g_ring = torch.zeros_like(d_ring)  # expect-bug: like
    return LayerStates(conv_state, ssm_state, d_ring, k_ring, g_ring)


def dummy_decode_states_fp32(model_dtype: torch.dtype, num_slots: int) -> LayerStates:
    states = dummy_decode_states(model_dtype, num_slots)
    states.g_ring = torch.zeros_like(states.d_ring, dtype=torch.float32)
    return states


def _metadata(num_decodes: int) -> KDAAttentionMetadata:
    return KDAAttentionMetadata(
        num_decodes=num_decodes,
        state_indices_tensor=torch.arange(num_decodes, dtype=torch.int32),
        write_pos_tensor=torch.zeros(num_decodes, dtype=torch.int32),
    )


def _layer_with(states: LayerStates) -> KimiDeltaAttention:
    layer = KimiDeltaAttention(CacheConfig(), torch.bfloat16, prefix="model.layers.0.self_attn")
    layer.kv_cache = states
    return layer


def build_profile_run_states() -> dict[str, torch.Tensor]:
    states = dummy_decode_states(torch.bfloat16, SLOTS)
    return {"d_ring": states.d_ring, "g_ring": states.g_ring}


def build_profile_run_states_fp32() -> dict[str, torch.Tensor]:
    states = dummy_decode_states_fp32(torch.bfloat16, SLOTS)
    return {"d_ring": states.d_ring, "k_ring": states.k_ring, "g_ring": states.g_ring}


def build_decode_eager() -> dict[str, Any]:
    states = dummy_decode_states_fp32(torch.bfloat16, SLOTS)
    _layer_with(states).forward_decode(_metadata(2))
    return dict(ops.LAST_CALL)


def build_decode_cudagraph() -> dict[str, Any]:
    states = dummy_decode_states_fp32(torch.bfloat16, SLOTS)
    _layer_with(states).forward_decode_cudagraph(_metadata(2))
    return dict(ops.LAST_CALL)


def build_decode_kwargs() -> dict[str, Any]:
    states = dummy_decode_states_fp32(torch.bfloat16, SLOTS)
    _layer_with(states).forward_decode_kwargs(_metadata(2))
    return dict(ops.LAST_CALL)
