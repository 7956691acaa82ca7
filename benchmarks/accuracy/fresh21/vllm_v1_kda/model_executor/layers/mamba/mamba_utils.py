"""State shapes and dtypes of the recurrent layers (vllm/model_executor/layers/mamba/mamba_utils.py)
and their common base (abstract.py)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable

import torch

from vllm_v1_kda.config import get_current_vllm_config
from vllm_v1_kda.utils import get_kv_cache_torch_dtype
from vllm_v1_kda.v1.kv_cache_interface import KVCacheSpec, MambaSpec


class MambaStateDtypeCalculator:
    @classmethod
    def _mamba_state_dtype(
        cls, model_dtype: torch.dtype, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str
    ) -> tuple[torch.dtype, ...]:
        conv_state_dtype = get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype)
        if mamba_ssm_cache_dtype == "auto":
            temporal_state_dtype = conv_state_dtype
        else:
            temporal_state_dtype = get_kv_cache_torch_dtype(mamba_ssm_cache_dtype, model_dtype)
        return (conv_state_dtype, temporal_state_dtype)

    @classmethod
    def kda_replay_state_dtype(
        cls, model_dtype: torch.dtype, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str
    ) -> tuple[torch.dtype, ...]:
        """(state, delta ring, key ring, gate ring).

        The gate ring holds per-step log-decays the kernel sums into prefix sums; the rounding
        error of a 16-bit ring becomes a relative error of every decay and is written back at
        each flush. It is float32 whatever the cache dtypes are.
        """
        state_dtype = get_kv_cache_torch_dtype(mamba_ssm_cache_dtype, model_dtype)
        ring_dtype = get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype)
        return (state_dtype, ring_dtype, ring_dtype, torch.float32)


class MambaStateShapeCalculator:
    @classmethod
    def kda_replay_state_shape(
        cls,
        tp_world_size: int,
        num_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        ring_len: int,
    ) -> tuple[tuple[int, ...], ...]:
        heads = num_heads // tp_world_size
        v_heads = num_v_heads // tp_world_size
        state_shape = (v_heads, head_v_dim, head_k_dim)
        d_shape = (v_heads, ring_len, head_v_dim)
        k_shape = (heads, ring_len, head_k_dim)
        g_shape = (v_heads, ring_len, head_k_dim)
        return state_shape, d_shape, k_shape, g_shape


class MambaBase:
    """Base of the layers whose cache is a fixed-size state per request."""

    kv_cache: list[Iterable[torch.Tensor]]

    @abstractmethod
    def get_state_shape(self) -> Iterable[tuple[int, ...]]:
        pass

    @abstractmethod
    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        pass

    @property
    @abstractmethod
    def mamba_type(self) -> str:
        pass

    @abstractmethod
    def get_attn_backend(self) -> type:
        pass

    def get_kv_cache_spec(self) -> KVCacheSpec:
        vllm_config = get_current_vllm_config()
        return MambaSpec(
            shapes=tuple(self.get_state_shape()),
            dtypes=self.get_state_dtype(),
            block_size=vllm_config.cache_config.block_size,
            mamba_type=self.mamba_type,
        )
