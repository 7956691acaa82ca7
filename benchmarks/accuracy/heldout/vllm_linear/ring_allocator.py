"""Allocator for the rings of requests that join mid-step (chunked prefill handoff)."""

from typing import Optional

import torch

from .config import ModelConfig

# Counts of rings handed out per layer index (bookkeeping only).
log_decay_ring_counts: dict[int, int] = {}


class RingAllocator:
    def __init__(self, model_config: ModelConfig, ring_len: int = 4) -> None:
        self.model_config = model_config
        self.ring_len = ring_len

    def allocate(self, num_slots: int, *, log_decay_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:  # expect-bug: container id=vlr-default
        cfg = self.model_config
        shape = (num_slots, cfg.linear_num_value_heads, self.ring_len, cfg.linear_head_dim)
        log_decay_ring = torch.empty(shape, dtype=log_decay_dtype).zero_()  # expect-bug: container id=vlr-default
        d_ring = torch.zeros(shape, dtype=cfg.dtype)
        return {"d_ring": d_ring, "log_decay_ring": log_decay_ring}

    def allocate_fp32(self, num_slots: int, *, log_decay_dtype: Optional[torch.dtype] = None) -> dict[str, torch.Tensor]:
        cfg = self.model_config
        shape = (num_slots, cfg.linear_num_value_heads, self.ring_len, cfg.linear_head_dim)
        log_decay_ring = torch.zeros(shape, dtype=torch.float32 if log_decay_dtype is None else log_decay_dtype)
        d_ring = torch.zeros(shape, dtype=cfg.dtype)
        return {"d_ring": d_ring, "log_decay_ring": log_decay_ring}


def count(layer_idx: int) -> int:
    log_decay_ring_counts[layer_idx] = log_decay_ring_counts.get(layer_idx, 0) + 1
    return log_decay_ring_counts[layer_idx]


def build_allocate_default() -> dict[str, torch.Tensor]:
    return RingAllocator(ModelConfig()).allocate(3)


def build_allocate_fp32() -> dict[str, object]:
    rings: dict[str, object] = dict(RingAllocator(ModelConfig()).allocate_fp32(3))
    rings["count"] = count(0)
    rings["positions"] = torch.arange(3, dtype=torch.int32)
    return rings
