"""Allocates the per-layer KDA state tensors from their specs (like the GPU model runner does)."""

from dataclasses import dataclass, field

import torch

from .config import CacheConfig, ring_dtypes

SLOTS, HEADS, VALUE_HEADS, RING, HEAD_K, HEAD_V, CONV = 3, 1, 2, 4, 4, 4, 3


@dataclass(frozen=True)
class KDAStateSpec:
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    block_size: int = 16


def kda_state_shapes(ring_len: int) -> tuple[tuple[int, ...], ...]:
    conv = (CONV, 2 * HEADS * HEAD_K + VALUE_HEADS * HEAD_V)
    ssm = (VALUE_HEADS, HEAD_V, HEAD_K)
    d_ring = (VALUE_HEADS, ring_len, HEAD_V)
    k_ring = (HEADS, ring_len, HEAD_K)
    g_ring = (VALUE_HEADS, ring_len, HEAD_K)
    return conv, ssm, d_ring, k_ring, g_ring


def allocate_kda_state(spec: KDAStateSpec, num_blocks: int, device: str) -> list[torch.Tensor]:
    return [
        torch.zeros((num_blocks, *shape), dtype=dtype, device=device)  # expect-bug: imported-policy id=vllm-calc
        for shape, dtype in zip(spec.shapes, spec.dtypes)
    ]


@dataclass
class LayerStates:
    conv_state: torch.Tensor
    ssm_state: torch.Tensor
    d_ring: torch.Tensor
    k_ring: torch.Tensor
    g_ring: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def bind_kv_cache(states: list[torch.Tensor]) -> LayerStates:
    conv_state, ssm_state, d_ring, k_ring, g_ring = states
    return LayerStates(conv_state, ssm_state, d_ring, k_ring, g_ring)


def reshape_for_prefix_caching(layer: LayerStates, num_blocks: int) -> LayerStates:
    # Views only: the model runner keeps one allocation per layer.
    return LayerStates(
        conv_state=layer.conv_state.view(num_blocks, -1, layer.conv_state.shape[-1]),
        ssm_state=layer.ssm_state,
        d_ring=layer.d_ring,
        k_ring=layer.k_ring,
        g_ring=layer.g_ring.view(num_blocks, VALUE_HEADS, -1, HEAD_K),
    )


def allocate_block_table(num_reqs: int, max_blocks: int) -> torch.Tensor:
    return torch.zeros(num_reqs, max_blocks, dtype=torch.int32)


def _spec(cache_config: CacheConfig, model_dtype: torch.dtype) -> KDAStateSpec:
    return KDAStateSpec(
        shapes=kda_state_shapes(cache_config.replay_ring_len),
        dtypes=ring_dtypes(cache_config, model_dtype),
    )


def build_states_auto_bf16() -> dict[str, torch.Tensor]:
    spec = _spec(CacheConfig(), torch.bfloat16)
    states = bind_kv_cache(allocate_kda_state(spec, SLOTS, "cpu"))
    return {"d_ring": states.d_ring, "k_ring": states.k_ring, "g_ring": states.g_ring}


def build_states_fp32_gate_policy() -> dict[str, torch.Tensor]:
    spec = _spec(CacheConfig(replay_fp32_gates=True), torch.bfloat16)
    states = reshape_for_prefix_caching(bind_kv_cache(allocate_kda_state(spec, SLOTS, "cpu")), SLOTS)
    return {
        "conv_state": states.conv_state,
        "ssm_state": states.ssm_state,
        "d_ring": states.d_ring,
        "k_ring": states.k_ring,
        "g_ring": states.g_ring,
        "block_table": allocate_block_table(2, 4),
    }
