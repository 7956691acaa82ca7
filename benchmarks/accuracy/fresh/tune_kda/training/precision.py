import contextlib
from collections.abc import Generator

import torch

PRECISION_STR_TO_DTYPE: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}


def get_dtype(dtype: str | None = None, device: torch.device | None = None) -> torch.dtype:
    """Get the torch.dtype corresponding to the given precision string. If no string is passed,
    we will default to torch.float32.

    Raises:
        ValueError: If dtype is not one of the supported precisions.
    """
    if dtype is None:
        return torch.float32
    if dtype not in PRECISION_STR_TO_DTYPE:
        raise ValueError(f"Dtype {dtype} must be one of {', '.join(PRECISION_STR_TO_DTYPE)}.")
    return PRECISION_STR_TO_DTYPE[dtype]


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Generator[None, None, None]:
    """Context manager to set torch's default dtype.

    Example:
        >>> with set_default_dtype(torch.bfloat16):
        >>>     x = torch.tensor([1.0, 2.0, 3.0])
        >>>     x.dtype
        torch.bfloat16
    """
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)


def get_cache_dtypes(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Storage dtypes of a KDA layer's decode caches, keyed by buffer name, for a model in ``dtype``."""
    return {
        "state": torch.float32,
        "d_cache": dtype,
        "k_cache": dtype,
        "g_cache": dtype,  # expect-bug: imported-policy id=tune-cache-dtypes
    }
