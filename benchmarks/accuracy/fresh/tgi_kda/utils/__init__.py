import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from tgi_kda.utils.weights import Weights, load_tensors, save_tensors

__all__ = ["Weights", "default_dtype", "load_tensors", "log_master", "save_tensors"]


def log_master(log: Callable[[str], None], msg: str) -> None:
    """Logs on rank 0 only (single process here)."""
    log(msg)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Creates modules directly in the serving dtype instead of float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


logging.getLogger("tgi_kda").addHandler(logging.NullHandler())
