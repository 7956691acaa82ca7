"""Paged attention in plain torch (the CPU backend of vllm/v1/attention/backends/cpu_attn.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_v1_kda.v1.attention.backends.utils import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)


class TorchSDPABackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "TORCH_SDPA"

    @staticmethod
    def get_impl_cls() -> type["TorchSDPAImpl"]:
        return TorchSDPAImpl

    @staticmethod
    def get_builder_cls() -> type["TorchSDPAMetadataBuilder"]:
        return TorchSDPAMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
    ) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)


@dataclass
class TorchSDPAMetadata:
    num_reqs: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


class TorchSDPAMetadataBuilder(AttentionMetadataBuilder[TorchSDPAMetadata]):
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata) -> TorchSDPAMetadata:
        m = common_attn_metadata
        return TorchSDPAMetadata(
            num_reqs=m.num_reqs,
            seq_lens=m.seq_lens[: m.num_reqs],
            block_table=m.block_table_tensor[: m.num_reqs],
            slot_mapping=m.slot_mapping[: m.num_actual_tokens],
        )


class TorchSDPAImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.num_queries_per_kv = num_heads // num_kv_heads

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TorchSDPAMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        """One decode token per request; padding rows (slot -1) give zeros and touch nothing."""
        num_reqs = attn_metadata.num_reqs
        q = query.view(-1, self.num_heads, self.head_size)
        k = key.view(-1, self.num_kv_heads, self.head_size)
        v = value.view(-1, self.num_kv_heads, self.head_size)
        if kv_cache.numel() == 0:
            # profile run: the cache is not allocated yet
            return output.zero_()
        key_cache, value_cache = kv_cache.unbind(0)
        block_size = key_cache.shape[1]
        for i in range(num_reqs):
            slot = int(attn_metadata.slot_mapping[i])
            if slot < 0:
                output[i].zero_()
                continue
            block, offset = divmod(slot, block_size)
            key_cache[block, offset] = k[i].to(key_cache.dtype)
            value_cache[block, offset] = v[i].to(value_cache.dtype)
            seq_len = int(attn_metadata.seq_lens[i])
            positions = torch.arange(seq_len, device=query.device)
            blocks = attn_metadata.block_table[i, positions // block_size].long()
            keys = key_cache[blocks, positions % block_size].float()
            values = value_cache[blocks, positions % block_size].float()
            keys = keys.repeat_interleave(self.num_queries_per_kv, dim=1)
            values = values.repeat_interleave(self.num_queries_per_kv, dim=1)
            scores = torch.einsum("hd,lhd->hl", q[i].float(), keys) * self.scale
            probs = torch.softmax(scores, dim=-1)
            output[i] = torch.einsum("hl,lhd->hd", probs, values).reshape(-1).to(output.dtype)
        return output
