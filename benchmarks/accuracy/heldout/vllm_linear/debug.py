"""Debug-mode state checks and dumps for the linear-attention layers."""

import pickle

import torch
from torch import nn

from .config import ModelConfig
from .ring_allocator import RingAllocator

LOG_DECAY_DTYPE = torch.float32


def assert_fp32(log_decay_ring: torch.Tensor) -> torch.Tensor:
    assert log_decay_ring.dtype is torch.float32, log_decay_ring.dtype
    return log_decay_ring


def dump(log_decay_ring: torch.Tensor) -> bytes:
    return pickle.dumps(log_decay_ring.detach().cpu())


def undump(raw: bytes) -> torch.Tensor:
    log_decay_ring = pickle.loads(raw).to(dtype=LOG_DECAY_DTYPE)
    return log_decay_ring


class StateProbe(nn.Module):
    """Holds a copy of the ring as a plain attribute (not a buffer), so .half() leaves it alone."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)
        self.log_decay_ring = torch.zeros(1, 2, 4, 4, dtype=LOG_DECAY_DTYPE)


def build_dump_roundtrip() -> dict[str, torch.Tensor]:
    log_decay_ring = assert_fp32(RingAllocator(ModelConfig()).allocate_fp32(2)["log_decay_ring"])
    restored = undump(dump(log_decay_ring.uniform_(-1, 0)))
    return {
        "log_decay_ring": restored,
        "spare_log_decay_ring": torch.empty_like(restored).zero_(),
        "row_log_decay_ring": restored.new_ones(4),
    }


def build_probe_half() -> dict[str, torch.Tensor]:
    probe = StateProbe().half()
    return {"log_decay_ring": probe.log_decay_ring, "weight": probe.head.weight}
