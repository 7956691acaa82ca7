# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Precision utilities: dtype names, the default-dtype context and the decode-cache dtype policy."""

import contextlib
from typing import Dict, Generator, Iterable, List, Optional, Tuple, Union

import torch

from tt_kda.utils import get_logger

log = get_logger()

PRECISION_STR_TO_DTYPE: Dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}

#: Decode-cache buffers kept in float32 whatever the compute dtype: the recurrent state, and the
#: ring of per-step log-decays, whose prefix sums are exponentiated on every replay and folded
#: into the state at each flush.
FULL_PRECISION_CACHE_BUFFERS = frozenset({"state", "log_decay_cache", "g_cache"})


def verify_bf16_support() -> bool:
    """Whether bf16 kernels are available: always on CPU, on CUDA from compute capability 8.0."""
    if not torch.cuda.is_available():
        return True
    return torch.cuda.is_bf16_supported()


def get_dtype(
    dtype: Optional[Union[str, torch.dtype]] = None, device: Optional[torch.device] = None
) -> torch.dtype:
    """Maps a precision string (``"bf16"``) or dtype to a supported ``torch.dtype``.

    Args:
        dtype (Optional[Union[str, torch.dtype]]): the requested precision; ``None`` is fp32.
        device (Optional[torch.device]): the device the dtype is used on, to check bf16 support.

    Returns:
        torch.dtype: the dtype.

    Raises:
        ValueError: for an unknown precision.
        RuntimeError: if bf16 is requested on a device without bf16 support.
    """
    if dtype is None:
        return torch.float32
    torch_dtype = PRECISION_STR_TO_DTYPE.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if torch_dtype not in PRECISION_STR_TO_DTYPE.values():
        raise ValueError(
            f"dtype {dtype!r} is not one of {sorted(PRECISION_STR_TO_DTYPE)} or their torch dtypes"
        )
    on_cpu = device is not None and torch.device(device).type == "cpu"
    if torch_dtype == torch.bfloat16 and not on_cpu and not verify_bf16_support():
        raise RuntimeError("bf16 precision was requested but is not supported on this hardware")
    return torch_dtype


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Generator[None, None, None]:
    """Context manager that sets torch's default dtype and restores the previous one on exit.

    Tensors created without an explicit ``dtype`` inside the block (module parameters in
    particular) get ``dtype``.

    Example:
        >>> with set_default_dtype(torch.bfloat16):
        ...     x = torch.tensor([1.0, 2.0])
        >>> x.dtype
        torch.bfloat16
    """
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)


def validate_expected_param_dtype(
    named_params: Iterable[Tuple[str, torch.nn.Parameter]],
    dtype: torch.dtype,
    exempt_param_names: Optional[List[str]] = None,
) -> None:
    """Raises if a parameter (other than the exempt ones) is not of ``dtype``."""
    exempt = set(exempt_param_names or ())
    for name, param in named_params:
        if name in exempt:
            continue
        if param.dtype != dtype:
            raise ValueError(f"{name} has dtype {param.dtype}, but expected {dtype}")


def cache_dtype_for(buffer_name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of one decode-cache buffer.

    The delta and key rings follow the compute dtype; the buffers in
    :data:`FULL_PRECISION_CACHE_BUFFERS` are always float32.

    Args:
        buffer_name (str): the buffer's attribute name on its cache module.
        compute_dtype (torch.dtype): the dtype the model runs in.

    Returns:
        torch.dtype: the dtype to allocate the buffer in.
    """
    if buffer_name in FULL_PRECISION_CACHE_BUFFERS:
        return torch.float32
    return compute_dtype
