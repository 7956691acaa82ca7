"""Resolves the dtypes of the linear-attention state from the model and cache configs."""

from dataclasses import dataclass

import torch

_STR_TO_DTYPE: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


@dataclass
class ModelConfig:
    dtype: torch.dtype = torch.bfloat16
    num_kda_layers: int = 2
    linear_num_heads: int = 1
    linear_num_value_heads: int = 2
    linear_head_dim: int = 4


@dataclass
class CacheConfig:
    mamba_cache_dtype: str = "auto"
    replay_ring_len: int = 4


def _resolve(name: str, model_dtype: torch.dtype) -> torch.dtype:
    return model_dtype if name == "auto" else _STR_TO_DTYPE[name]


def linear_attn_state_dtypes(model_config: ModelConfig, cache_config: CacheConfig) -> dict[str, torch.dtype]:
    """Per-tensor dtypes: the checkpoint state and the three replay rings."""
    state_dtype = _resolve(cache_config.mamba_cache_dtype, model_config.dtype)
    return {name: state_dtype for name in ("ssm_state", "d_ring", "k_ring", "log_decay_ring")}  # expect-bug: imported-policy id=vl-dtypes


def linear_attn_state_dtypes_fp32_decay(model_config: ModelConfig, cache_config: CacheConfig) -> dict[str, torch.dtype]:
    state_dtype = _resolve(cache_config.mamba_cache_dtype, model_config.dtype)
    dtypes = {name: state_dtype for name in ("ssm_state", "d_ring", "k_ring")}
    dtypes["log_decay_ring"] = torch.float32
    return dtypes
