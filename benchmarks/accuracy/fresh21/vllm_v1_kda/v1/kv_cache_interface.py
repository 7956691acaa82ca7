"""What each layer needs from the KV cache, and how the cache is laid out (vllm/v1/kv_cache_interface.py)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch

from vllm_v1_kda.utils import cdiv, get_dtype_size


@dataclass(frozen=True)
class KVCacheSpec:
    """A base class for specifying the KV cache format of one layer."""

    # number of tokens in a block
    block_size: int

    @property
    def type_id(self) -> str:
        raise NotImplementedError

    @property
    def page_size_bytes(self) -> int:
        """The size of a page with `block_size` tokens in bytes."""
        raise NotImplementedError

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        raise NotImplementedError

    @classmethod
    def merge(cls, specs: list["KVCacheSpec"]) -> "KVCacheSpec":
        assert all(spec == specs[0] for spec in specs[1:]), (
            "All layers in the same KV cache group must be the same."
        )
        return copy.deepcopy(specs[0])


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        # For MLA we only store a single latent vector
        coef = 2
        return coef * self.block_size * self.num_kv_heads * self.head_size * get_dtype_size(self.dtype)


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: Optional[int] = None

    @property
    def type_id(self) -> str:
        return f"full_attention_{self.block_size}_{self.page_size_bytes}"

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A recurrent layer's cache: one block (slot) per request, several states per slot.

    For KDA ReplaySSM the states are, in this order, the checkpoint state ``[HV, V, K]``,
    the delta ring ``[HV, L, V]``, the key ring ``[H, L, K]`` and the gate ring ``[HV, L, K]``.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_size_padded: Optional[int] = None
    mamba_type: str = "mamba2"
    num_speculative_blocks: int = 0

    @property
    def page_size_bytes(self) -> int:
        page_size = sum(
            math.prod(shape) * get_dtype_size(dtype) for (shape, dtype) in zip(self.shapes, self.dtypes)
        )
        if self.page_size_padded is not None:
            assert self.page_size_padded >= page_size
            return self.page_size_padded
        return page_size

    @property
    def dtype(self) -> torch.dtype:
        """The checkpoint state's dtype; what code written for ``AttentionSpec`` reports."""
        return self.dtypes[0]

    @property
    def type_id(self) -> str:
        return f"mamba_{self.mamba_type}_{self.page_size_bytes}"

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        return self.page_size_bytes * (1 + self.num_speculative_blocks)


@dataclass
class KVCacheTensor:
    """A raw buffer of ``size`` bytes, shared by the layers in ``shared_by``."""

    size: int
    shared_by: list[str]


@dataclass
class KVCacheGroupSpec:
    """Layers with the same spec and the same block table."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    """How the KV cache of the model is allocated and grouped."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]


def spec_field_names(spec: KVCacheSpec) -> list[str]:
    return [f.name for f in fields(spec)]
