from contextlib import contextmanager

import torch

from .dist import initialize_torch_distributed
from .weights import Weights, save_file


@contextmanager
def set_default_dtype(dtype: torch.dtype):
    """Makes ``dtype`` torch's default floating dtype inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


__all__ = [
    "Weights",
    "initialize_torch_distributed",
    "save_file",
    "set_default_dtype",
]
