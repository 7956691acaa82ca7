"""Shapes and dtypes of one KDA layer's state, derived from the model config."""

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .environ import ssm_dtype_from_env


class StateDType(NamedTuple):
    conv: torch.dtype
    temporal: torch.dtype


@dataclass(frozen=True, kw_only=True)
class KimiLinearStateParams:
    num_k_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    ring: int = 4
    layers: tuple[int, ...] = (0, 1)
    dtype: StateDType = field(default_factory=lambda: StateDType(torch.bfloat16, ssm_dtype_from_env()))

    @property
    def gate_ring_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def temporal_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_dim, self.head_dim)

    @property
    def ring_shapes(self) -> dict[str, tuple[int, int, int]]:
        return {
            "d_ring": (self.num_v_heads, self.ring, self.head_dim),
            "k_ring": (self.num_k_heads, self.ring, self.head_dim),
            "gate_ring": (self.num_v_heads, self.ring, self.head_dim),
        }


@dataclass(frozen=True, kw_only=True)
class KimiLinearStateParamsConvDtype(KimiLinearStateParams):
    """Older checkpoints: the gate ring shared the conv-state dtype."""

    @property
    def gate_ring_dtype(self) -> torch.dtype:
        return self.dtype.conv  # expect-bug: container id=sr-prop
