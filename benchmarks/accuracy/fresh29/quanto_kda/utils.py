"""Dtype names used by configs and checkpoints, the default-dtype context, the residual policy."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

STR_TO_DTYPE = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "int8": torch.int8, "uint8": torch.uint8,
}


def to_dtype(value: str | torch.dtype) -> torch.dtype:
    return value if isinstance(value, torch.dtype) else STR_TO_DTYPE[value]


@contextlib.contextmanager
def default_dtype(dtype: str | torch.dtype) -> Iterator[None]:
    """Build modules at ``dtype`` (what ``from_pretrained(torch_dtype=...)`` does)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(to_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def residual_dtype(ring: str, compute_dtype: str | torch.dtype) -> torch.dtype:
    """Storage dtype of a ring that a quantized cache keeps unquantized (its "residual")."""
    if ring == "state":
        return torch.float32
    return to_dtype(compute_dtype)  # expect-bug: imported-policy id=residual-policy
