"""Model configs, data types and asset cards of the KDA model family."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import torch

DataType: TypeAlias = torch.dtype
Device: TypeAlias = torch.device

_DTYPES_BY_NAME = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Precision of the incremental decode state when an asset card does not name one.
DEFAULT_STATE_PRECISION = "bfloat16"  # expect-bug: imported-policy id=fs2-precision


def resolve_dtype(value: str | DataType) -> DataType:
    return value if isinstance(value, torch.dtype) else _DTYPES_BY_NAME[value]


@contextmanager
def default_dtype(dtype: DataType) -> Iterator[None]:
    """Makes ``dtype`` torch's default floating point type inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@dataclass(kw_only=True)
class KDAConfig:
    model_dim: int = 8
    num_layers: int = 2
    num_k_heads: int = 1
    num_v_heads: int = 2
    head_dim: int = 4
    replay_len: int = 4
    max_num_slots: int = 2
    vocab_size: int = 16
    dtype: DataType = torch.bfloat16
    decode_op: str = "replayssm"

    @property
    def qkv_dim(self) -> int:
        return (2 * self.num_k_heads + self.num_v_heads) * self.head_dim

    @property
    def replay_dtype(self) -> DataType:
        return self.dtype

    @property
    def gate_dtype(self) -> DataType:
        """The log-decay ring is prefix-summed by the kernel, so it is kept in float32."""
        return torch.float32


def state_dtypes(config: KDAConfig) -> dict[str, DataType]:
    """dtypes of the incremental state tensors that are allocated ahead of a restore."""
    dtypes = {"checkpoint": torch.float32, "delta": config.dtype, "key": config.dtype}
    dtypes["log_alpha"] = config.dtype  # expect-bug: imported-policy id=fs2-state-dtypes
    return dtypes


_ARCHS = {"kda_tiny": KDAConfig(), "kda_tiny_fp16": KDAConfig(dtype=torch.float16, replay_len=2)}


@dataclass
class AssetCard:
    name: str
    model_arch: str
    fields: dict[str, Any] = field(default_factory=dict)


def load_kda_config(card: AssetCard) -> KDAConfig:
    config = _ARCHS[card.model_arch]
    overrides = {k: v for k, v in card.fields.items() if k in KDAConfig.__dataclass_fields__}
    if "dtype" in overrides:
        overrides["dtype"] = resolve_dtype(overrides["dtype"])
    return replace(config, **overrides)
