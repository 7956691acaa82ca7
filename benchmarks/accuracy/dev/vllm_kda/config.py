"""Cache dtype resolution for KDA layers (cache_config.mamba_*_dtype, "auto" = model dtype)."""

from dataclasses import dataclass

import torch

STR_DTYPE_TO_TORCH_DTYPE = {
    "half": torch.half,
    "bfloat16": torch.bfloat16,
    "float": torch.float,
    "float32": torch.float32,
    "fp8": torch.uint8,
}


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    replay_ring_len: int = 4
    # Keep the gate ring in float32 whatever the model runs in.
    replay_fp32_gates: bool = False


def get_kv_cache_torch_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    if cache_dtype == "auto":
        return model_dtype
    return STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]


class ReplaySSMStateDtypeCalculator:
    """Dtypes of (conv_state, ssm_state, d_ring, k_ring, g_ring) for one KDA layer."""

    @classmethod
    def kda_state_dtype(
        cls,
        model_dtype: torch.dtype,
        mamba_cache_dtype: str,
        mamba_ssm_cache_dtype: str,
    ) -> tuple[torch.dtype, ...]:
        state_dtype = get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype)
        if mamba_ssm_cache_dtype == "auto":
            ssm_dtype = state_dtype
        else:
            ssm_dtype = STR_DTYPE_TO_TORCH_DTYPE[mamba_ssm_cache_dtype]
        return (state_dtype, ssm_dtype, state_dtype, state_dtype, state_dtype)  # expect-bug: imported-policy id=vllm-calc

    @classmethod
    def kda_state_dtype_fp32_gates(
        cls,
        model_dtype: torch.dtype,
        mamba_cache_dtype: str,
        mamba_ssm_cache_dtype: str,
    ) -> tuple[torch.dtype, ...]:
        state_dtype = get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype)
        ssm_dtype = (
            state_dtype
            if mamba_ssm_cache_dtype == "auto"
            else STR_DTYPE_TO_TORCH_DTYPE[mamba_ssm_cache_dtype]
        )
        return (state_dtype, ssm_dtype, state_dtype, state_dtype, torch.float32)


def ring_dtypes(cache_config: CacheConfig, model_dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    calc = ReplaySSMStateDtypeCalculator
    if cache_config.replay_fp32_gates:
        return calc.kda_state_dtype_fp32_gates(
            model_dtype, cache_config.mamba_cache_dtype, cache_config.mamba_ssm_cache_dtype
        )
    return calc.kda_state_dtype(
        model_dtype, cache_config.mamba_cache_dtype, cache_config.mamba_ssm_cache_dtype
    )
