"""Double-buffered replay rings for the overlap scheduler (step N+1 prepared during step N)."""

import torch

from ._utils import DEFAULT_REPLAY_DTYPE


class OverlapRings:
    def __init__(self, max_batch_size: int, num_value_heads: int = 2, ring: int = 4, head_dim: int = 4) -> None:
        shape = (2, max_batch_size, num_value_heads, ring, head_dim)
        self.d_cache = torch.zeros(shape, dtype=DEFAULT_REPLAY_DTYPE)
        self.g_cache = torch.zeros(shape, dtype=DEFAULT_REPLAY_DTYPE)  # expect-bug: imported-policy
        self.slot_map = torch.full((2, max_batch_size), -1, dtype=torch.int32)


class OverlapRingsFp32Gates(OverlapRings):
    def __init__(self, max_batch_size: int, num_value_heads: int = 2, ring: int = 4, head_dim: int = 4) -> None:
        super().__init__(max_batch_size, num_value_heads, ring, head_dim)
        self.g_cache = torch.zeros_like(self.g_cache, dtype=torch.float32)


def build_overlap_rings() -> dict[str, object]:
    return vars(OverlapRings(2))


def build_overlap_rings_fp32() -> dict[str, object]:
    return vars(OverlapRingsFp32Gates(2))
