"""User-facing cache options (llmapi KvCacheConfig) and how they resolve to dtypes."""

from dataclasses import dataclass

import torch

from ._utils import binding_to_torch_dtype, str_dtype_to_torch


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    replay_ring_dtype: str = "auto"
    replay_ring_length: int = 4


@dataclass(frozen=True)
class ReplayCacheDtypes:
    ssm: torch.dtype
    d_ring: torch.dtype
    k_ring: torch.dtype
    g_ring: torch.dtype


def resolve_replay_dtypes(config: KvCacheConfig, model_dtype: torch.dtype) -> ReplayCacheDtypes:
    ring_dtype = binding_to_torch_dtype(config.replay_ring_dtype, model_dtype)
    return ReplayCacheDtypes(
        ssm=binding_to_torch_dtype(config.mamba_ssm_cache_dtype, model_dtype),
        d_ring=ring_dtype,
        k_ring=ring_dtype,
        g_ring=ring_dtype,  # expect-bug: imported-policy id=trt-resolve
    )


def resolve_replay_dtypes_fp32_gates(config: KvCacheConfig, model_dtype: torch.dtype) -> ReplayCacheDtypes:
    ring_dtype = binding_to_torch_dtype(config.replay_ring_dtype, model_dtype)
    return ReplayCacheDtypes(
        ssm=binding_to_torch_dtype(config.mamba_ssm_cache_dtype, model_dtype),
        d_ring=ring_dtype,
        k_ring=ring_dtype,
        g_ring=str_dtype_to_torch("float32"),
    )
