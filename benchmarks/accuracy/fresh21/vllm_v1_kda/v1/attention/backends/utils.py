"""Shared pieces of the V1 attention backends (vllm/v1/attention/backends/utils.py)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Optional, TypeVar

import torch

if TYPE_CHECKING:
    from vllm_v1_kda.config import VllmConfig
    from vllm_v1_kda.v1.kv_cache_interface import KVCacheSpec

PAD_SLOT_ID = -1


@dataclass
class CommonAttentionMetadata:
    """Per-batch metadata every backend builds its own from."""

    num_reqs: int
    num_actual_tokens: int
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    replay_write_pos: Optional[torch.Tensor] = None
    """Ring cursor of each request (KDA ReplaySSM), int32."""
    replay_force_flush: Optional[torch.Tensor] = None


M = TypeVar("M")


class AttentionMetadataBuilder(abc.ABC, Generic[M]):
    reorder_batch_threshold: ClassVar[Optional[int]] = None

    def __init__(
        self, kv_cache_spec: "KVCacheSpec", layer_names: list[str], vllm_config: "VllmConfig", device: torch.device
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device

    @abc.abstractmethod
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata) -> M:
        raise NotImplementedError

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> M:
        return self.build(common_prefix_len=0, common_attn_metadata=common_attn_metadata)


class AttentionBackend(abc.ABC):
    @staticmethod
    @abc.abstractmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    @abc.abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder[Any]]:
        raise NotImplementedError
