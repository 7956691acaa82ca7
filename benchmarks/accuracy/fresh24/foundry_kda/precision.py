# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Numeric precision: Composer's ``Precision`` names and the dtypes derived from them.

Training and serving configs name a precision (``fp32``, ``amp_bf16``, ...). The helpers here
turn it into the autocast context for a forward pass and into the storage dtypes of the
ReplaySSM decode caches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

__all__ = [
    "GATE_DTYPE",
    "PRECISION_TO_DTYPE",
    "Precision",
    "RingDtypes",
    "default_dtype",
    "get_model_dtype",
    "get_precision_context",
    "ring_dtypes_for",
    "ring_storage_dtype",
    "to_precision",
]


class Precision(str, Enum):
    """Enum of the precisions a run may use (names as in ``composer.core.Precision``)."""

    FP32 = "fp32"
    AMP_FP16 = "amp_fp16"
    AMP_BF16 = "amp_bf16"
    AMP_FP8 = "amp_fp8"


PRECISION_TO_DTYPE: dict[Precision, torch.dtype] = {
    Precision.FP32: torch.float32,
    Precision.AMP_FP16: torch.float16,
    Precision.AMP_BF16: torch.bfloat16,
    # fp8 runs keep bf16 activations outside the fp8 GEMMs.
    Precision.AMP_FP8: torch.bfloat16,
}

#: The log-decay ("gate") ring is accumulated by prefix sums over the whole ring and folded
#: into the checkpoint at every flush; it is kept in float32 whatever the model runs in.
GATE_DTYPE = torch.float32


def to_precision(precision: str | Precision) -> Precision:
    if isinstance(precision, Precision):
        return precision
    try:
        return Precision(str(precision).lower())
    except ValueError:
        names = ", ".join(p.value for p in Precision)
        raise ValueError(f"unknown precision {precision!r} (expected one of {names})") from None


def get_model_dtype(precision: str | Precision) -> torch.dtype:
    """The dtype activations are computed in under ``precision``."""
    return PRECISION_TO_DTYPE[to_precision(precision)]


@contextlib.contextmanager
def get_precision_context(
    precision: str | Precision,
    precision_config: dict[str, Any] | None = None,
    device_type: str = "cpu",
) -> Iterator[None]:
    """Autocast context for a forward pass under ``precision``.

    Args:
        precision: The run's precision.
        precision_config: Extra options; only ``cache_enabled`` is read.
        device_type: The device the forward pass runs on.
    """
    precision = to_precision(precision)
    options = dict(precision_config or {})
    if precision is Precision.FP32:
        yield
    elif precision in (Precision.AMP_BF16, Precision.AMP_FP16):
        dtype = PRECISION_TO_DTYPE[precision]
        cache_enabled = bool(options.get("cache_enabled", True))
        with torch.autocast(device_type, dtype=dtype, cache_enabled=cache_enabled):
            yield
    else:
        raise NotImplementedError(f"{precision.value} needs Transformer Engine, which is not installed")


def ring_storage_dtype(precision: str | Precision, ring: str) -> torch.dtype:
    """Storage dtype of one part of a replay cache under ``precision``.

    ``ring`` is ``"state"`` (the checkpoint), ``"delta"``, ``"key"`` or ``"gate"``. The
    checkpoint is accumulated in float32; the rings are stored in the dtype the model computes
    in, so that the decode kernel reads them without a conversion.
    """
    if ring not in ("state", "delta", "key", "gate"):
        raise ValueError(f"unknown replay-cache part {ring!r}")
    if ring == "state":
        return torch.float32
    return get_model_dtype(precision)  # expect-bug: imported-policy id=ring-storage


@dataclass(frozen=True)
class RingDtypes:
    """Storage dtypes of one replay cache: checkpoint, delta ring, key ring and gate ring."""

    delta: torch.dtype = torch.bfloat16
    key: torch.dtype = torch.bfloat16
    gate: torch.dtype = GATE_DTYPE
    state: torch.dtype = torch.float32

    def as_dict(self) -> dict[str, torch.dtype]:
        return {
            "state": self.state,
            "d_cache": self.delta,
            "k_cache": self.key,
            "g_cache": self.gate,
        }


def ring_dtypes_for(precision: str | Precision) -> RingDtypes:
    """Ring dtypes for a run in ``precision``: deltas and keys follow the model dtype."""
    dtype = get_model_dtype(precision)
    return RingDtypes(delta=dtype, key=dtype)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets torch's default floating dtype for the duration of the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
