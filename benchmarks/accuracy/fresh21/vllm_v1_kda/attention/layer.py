"""The attention layer models call (vllm/attention/layer.py)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm_v1_kda.config import CacheConfig, get_current_vllm_config
from vllm_v1_kda.forward_context import get_forward_context
from vllm_v1_kda.v1.attention.backends.torch_sdpa import TorchSDPABackend
from vllm_v1_kda.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm_v1_kda.utils import STR_DTYPE_TO_TORCH_DTYPE


class Attention(nn.Module):
    """Paged attention over the layer's block of the KV cache.

    The cache is bound later, by the model runner (``bind_kv_cache``); until then
    ``self.kv_cache`` holds empty placeholders, one per virtual engine.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: Optional[int] = None,
        cache_config: Optional[CacheConfig] = None,
        prefix: str = "",
        kv_sharing_target_layer_name: Optional[str] = None,
    ) -> None:
        super().__init__()
        vllm_config = get_current_vllm_config()
        cache_config = cache_config or vllm_config.cache_config
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = cache_config.cache_dtype
        self.layer_name = prefix
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_backend = TorchSDPABackend
        self.impl = TorchSDPABackend.get_impl_cls()(num_heads, head_size, scale, self.num_kv_heads)
        compilation_config = vllm_config.compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self
        # placeholders; replaced by bind_kv_cache
        self.kv_cache = [torch.tensor([]) for _ in range(vllm_config.parallel_config.pipeline_parallel_size)]

    def get_attn_backend(self) -> type[TorchSDPABackend]:
        return self.attn_backend

    def get_kv_cache_spec(self, block_size: int, model_dtype: torch.dtype) -> KVCacheSpec:
        if self.kv_cache_dtype == "auto":
            dtype = model_dtype
        else:
            dtype = STR_DTYPE_TO_TORCH_DTYPE[self.kv_cache_dtype]
        return FullAttentionSpec(
            block_size=block_size, num_kv_heads=self.num_kv_heads, head_size=self.head_size, dtype=dtype
        )

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        forward_context = get_forward_context()
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        attn_metadata = forward_context.attn_metadata
        if attn_metadata is None:
            # profile run: no cache bound yet
            return output.zero_()
        kv_cache = self.kv_cache[forward_context.virtual_engine]
        return self.impl.forward(query, key, value, kv_cache, attn_metadata[self.layer_name], output)
