"""Cache parameters derived from the model config (sglang's configs/ and mamba_utils)."""

import os
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

DTYPE_MAP = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class Mamba2StateDType(NamedTuple):
    conv: torch.dtype
    temporal: torch.dtype


class ReplayRingDType(NamedTuple):
    d: torch.dtype
    k: torch.dtype
    g: torch.dtype


def mamba2_state_dtype() -> Mamba2StateDType:
    ssm_dtype = DTYPE_MAP[os.environ.get("SGLANG_MAMBA_SSM_DTYPE", "float32")]
    return Mamba2StateDType(conv=torch.bfloat16, temporal=ssm_dtype)


def replay_ring_dtype(model_dtype: torch.dtype) -> ReplayRingDType:
    return ReplayRingDType(d=model_dtype, k=model_dtype, g=torch.float32)


@dataclass(kw_only=True, frozen=True)
class KimiLinearCacheParams:
    num_heads: int = 1
    num_value_heads: int = 2
    head_k_dim: int = 4
    head_v_dim: int = 4
    conv_kernel_size: int = 4
    ring_length: int = 4
    layers: list[int] = field(default_factory=lambda: [0, 1])
    dtype: Mamba2StateDType = field(default_factory=mamba2_state_dtype)
    ring_dtype: ReplayRingDType = field(default_factory=lambda: replay_ring_dtype(torch.bfloat16))

    @property
    def ring_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        d = (self.num_value_heads, self.ring_length, self.head_v_dim)
        k = (self.num_heads, self.ring_length, self.head_k_dim)
        g = (self.num_value_heads, self.ring_length, self.head_k_dim)
        return d, k, g

    @property
    def temporal_shape(self) -> tuple[int, ...]:
        return (self.num_value_heads, self.head_v_dim, self.head_k_dim)


@dataclass(kw_only=True, frozen=True)
class KimiLinearCacheParamsLegacy(KimiLinearCacheParams):
    """Before the ring dtype was split out, every ring followed the conv-state dtype."""

    ring_dtype: ReplayRingDType = field(
        default_factory=lambda: ReplayRingDType(*(mamba2_state_dtype().conv,) * 3)  # expect-bug: container id=sgl-legacy
    )
