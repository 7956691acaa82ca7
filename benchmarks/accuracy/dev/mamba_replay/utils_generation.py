"""Inference parameters shared by every layer during generation."""

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class InferenceParams:
    """Holds the per-layer states between decode steps; layers key their states by layer_idx."""

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict[int, Any] = field(default_factory=dict)
    lengths_per_sample: Optional[torch.Tensor] = None

    def reset(self, max_seqlen: int, max_batch_size: int) -> None:
        self.max_seqlen = max_seqlen
        self.max_batch_size = max_batch_size
        self.seqlen_offset = 0
        if self.lengths_per_sample is not None:
            self.lengths_per_sample.zero_()


@dataclass
class DecodingCGCache:
    max_batch_size: int = 0
    max_seqlen: int = 0
    device: Optional[torch.device] = None
    dtype: Optional[torch.dtype] = None
    inference_params: Optional[InferenceParams] = None
    callables: dict[tuple[int, int], Any] = field(default_factory=dict)


def alloc_like(shape: tuple[int, ...], ref: torch.Tensor) -> torch.Tensor:
    """A zeroed state tensor on the reference's device, in its dtype."""
    return torch.zeros(shape, dtype=ref.dtype, device=ref.device)
