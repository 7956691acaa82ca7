"""Allocates each KDA layer's state from its shape and dtype tables."""

import torch

from .config import CacheConfig, ModelConfig, linear_attn_state_dtypes, linear_attn_state_dtypes_fp32_decay


def linear_attn_state_shapes(model_config: ModelConfig, cache_config: CacheConfig) -> dict[str, tuple[int, ...]]:
    hv, h, dim = model_config.linear_num_value_heads, model_config.linear_num_heads, model_config.linear_head_dim
    ring = cache_config.replay_ring_len
    return {
        "ssm_state": (hv, dim, dim),
        "d_ring": (hv, ring, dim),
        "k_ring": (h, ring, dim),
        "log_decay_ring": (hv, ring, dim),
    }


def allocate_layer_state(
    num_slots: int,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict[str, torch.dtype],
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        state[name] = torch.empty((num_slots, *shape), dtype=dtypes[name], device=device).zero_()  # expect-bug: imported-policy id=vl-dtypes
    return state


def allocate_kv_caches(
    model_config: ModelConfig, cache_config: CacheConfig, num_slots: int, fp32_decay: bool
) -> list[dict[str, torch.Tensor]]:
    resolve = linear_attn_state_dtypes_fp32_decay if fp32_decay else linear_attn_state_dtypes
    dtypes = resolve(model_config, cache_config)
    shapes = linear_attn_state_shapes(model_config, cache_config)
    return [allocate_layer_state(num_slots, shapes, dtypes) for _ in range(model_config.num_kda_layers)]


def build_kv_caches_auto() -> dict[str, object]:
    return {"layers": allocate_kv_caches(ModelConfig(), CacheConfig(), 3, fp32_decay=False)}


def build_kv_caches_fp32_decay() -> dict[str, object]:
    return {"layers": allocate_kv_caches(ModelConfig(), CacheConfig(), 3, fp32_decay=True)}


def build_kv_caches_fp16_cache_dtype() -> dict[str, object]:
    caches = allocate_kv_caches(ModelConfig(), CacheConfig(mamba_cache_dtype="float16"), 3, fp32_decay=True)
    return {"layers": caches}
