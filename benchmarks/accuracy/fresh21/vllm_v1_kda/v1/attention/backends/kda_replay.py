"""Backend of the KDA layers decoded with ReplaySSM.

A request owns one slot of each KDA layer's pool (its first block id, as for every mamba-like
layer in V1). The slot holds the checkpoint state and three rings; the ring cursor
(``write_pos``) lives in the runner's persistent batch and is advanced after each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from vllm_v1_kda.v1.attention.backends.utils import (
    PAD_SLOT_ID,
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)


class KDAReplayState(NamedTuple):
    """The four tensors of one KDA layer's pool, in ``MambaSpec.shapes`` order."""

    state: torch.Tensor
    """[num_slots, HV, V, K] checkpoint, written back on flush."""
    d_cache: torch.Tensor
    """[num_slots, HV, L, V] deltas."""
    k_cache: torch.Tensor
    """[num_slots, H, L, K] normalised keys."""
    g_cache: torch.Tensor
    """[num_slots, HV, L, K] per-step log-decays (fp32)."""


class KDAReplayBackend(AttentionBackend):
    # name of the state that holds the log-decays, for logs and the connector's file layout
    GATE_STATE = "g_cache"

    @staticmethod
    def get_name() -> str:
        return "KDA_REPLAY"

    @staticmethod
    def get_builder_cls() -> type["KDAReplayMetadataBuilder"]:
        return KDAReplayMetadataBuilder

    @staticmethod
    def get_state_names() -> tuple[str, ...]:
        return KDAReplayState._fields

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        num_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        ring_len: int,
    ) -> tuple[tuple[int, ...], ...]:
        return (
            (num_blocks, num_v_heads, head_v_dim, head_k_dim),
            (num_blocks, num_v_heads, ring_len, head_v_dim),
            (num_blocks, num_heads, ring_len, head_k_dim),
            (num_blocks, num_v_heads, ring_len, head_k_dim),
        )


@dataclass
class KDAReplayMetadata:
    num_reqs: int
    state_indices_tensor: torch.Tensor
    """[num_reqs] int32 slot of each request; PAD_SLOT_ID for padding."""
    write_pos: torch.Tensor
    """[num_reqs] int32 ring cursor."""
    force_flush: Optional[torch.Tensor] = None


class KDAReplayMetadataBuilder(AttentionMetadataBuilder[KDAReplayMetadata]):
    reorder_batch_threshold = 1

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata) -> KDAReplayMetadata:
        m = common_attn_metadata
        num_reqs = m.num_reqs
        state_indices = m.block_table_tensor[:num_reqs, 0].to(torch.int32)
        if m.replay_write_pos is None:
            write_pos = torch.zeros(num_reqs, dtype=torch.int32, device=self.device)
        else:
            write_pos = m.replay_write_pos[:num_reqs].to(torch.int32)
        force_flush = None if m.replay_force_flush is None else m.replay_force_flush[:num_reqs]
        return KDAReplayMetadata(num_reqs, state_indices, write_pos, force_flush)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> KDAReplayMetadata:
        num_reqs = common_attn_metadata.num_reqs
        return KDAReplayMetadata(
            num_reqs=num_reqs,
            state_indices_tensor=torch.full((num_reqs,), PAD_SLOT_ID, dtype=torch.int32, device=self.device),
            write_pos=torch.zeros(num_reqs, dtype=torch.int32, device=self.device),
            force_flush=None,
        )
