# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Utility functions for training and inference."""

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, NamedTuple, Optional, Union

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from litgpt_kda.fabric import Fabric


def find_multiple(n: int, k: int) -> int:
    assert k > 0
    if n % k == 0:
        return n
    return n + k - (n % k)


def get_default_supported_precision(training: bool) -> str:
    """Return default precision that is supported by the hardware: either `bf16` or `16`.

    Args:
        training: `-mixed` or `-true` version of the precision to use

    Returns:
        default precision that is suitable for the task and is supported by the hardware
    """
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return "16-mixed" if training else "16-true"
    return "bf16-mixed" if training else "bf16-true"


_PRECISION_TO_DTYPE: Dict[str, torch.dtype] = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "32": torch.float32,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
    # mixed precision keeps the weights (and so the caches) in float32
    "bf16-mixed": torch.float32,
    "16-mixed": torch.float32,
}


def precision_to_dtype(precision: Union[str, torch.dtype]) -> torch.dtype:
    """The dtype the weights live in under a Fabric precision string (``"bf16-true"`` -> bfloat16)."""
    if isinstance(precision, torch.dtype):
        return precision
    try:
        return _PRECISION_TO_DTYPE[precision]
    except KeyError:
        raise ValueError(
            f"Unsupported precision {precision!r}, expected one of {sorted(_PRECISION_TO_DTYPE)}"
        ) from None


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Makes ``dtype`` torch's default floating point dtype inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class RingDtypes(NamedTuple):
    """dtypes of one layer's replay caches."""

    delta: torch.dtype
    """The checkpoint state and the delta ring."""
    key: torch.dtype
    logdecay: torch.dtype = torch.float32


def ring_dtypes(precision: str) -> RingDtypes:
    """The replay-cache dtypes for a model set up with ``precision``.

    The checkpoint states and the delta/key rings follow the weights. The log-decay ring stays in
    float32, except under ``"16-true"``: float16 keeps 11 significant bits, enough for per-step
    log-decays of magnitude below one, and keeps the ring layout uniform for the fused kernels.
    """
    dtype = precision_to_dtype(precision)
    if dtype == torch.float16:
        return RingDtypes(delta=dtype, key=dtype, logdecay=dtype)  # expect-bug: imported-policy id=half-rings
    return RingDtypes(delta=dtype, key=dtype)


def lazy_load(checkpoint_path: Union[str, Path]) -> Any:
    """Memory-maps a checkpoint: tensors are read from disk only when they are used."""
    return torch.load(str(checkpoint_path), mmap=True, weights_only=True)


def load_checkpoint(
    fabric: Optional["Fabric"], model: nn.Module, checkpoint_path: Path, strict: bool = True
) -> None:
    """Loads ``checkpoint_path`` into ``model``.

    The checkpoint tensors are converted to the dtype the model was set up in while they are still
    memory-mapped, so a float32 checkpoint never exists twice in host memory. Models created under
    ``fabric.init_module(empty_init=True)`` hold no initialised storage, so the converted tensors
    are assigned rather than copied.
    """
    state_dict = lazy_load(checkpoint_path)
    state_dict = state_dict.get("model", state_dict)
    dtype = next(model.parameters()).dtype
    state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}  # expect-bug: load id=ckpt-dtype
    missing, unexpected = model.load_state_dict(state_dict, strict=strict, assign=True)  # expect-bug: load id=ckpt-dtype
    if fabric is not None and (missing or unexpected):
        fabric.print(f"Missing keys: {missing}\nUnexpected keys: {unexpected}", file=sys.stderr)
