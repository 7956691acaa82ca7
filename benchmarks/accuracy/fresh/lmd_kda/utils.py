"""Helpers shared by the engine (lmdeploy/utils.py)."""

from __future__ import annotations

import logging
import math

import torch

_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(filename)s:%(lineno)d - %(message)s"

_STR_TO_TORCH_DTYPE = {
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


def get_logger(name: str, log_level: int = logging.WARNING) -> logging.Logger:
    """A logger in lmdeploy's format."""
    logging.basicConfig(format=_FORMAT)
    logger = logging.getLogger(name)
    logger.setLevel(log_level)
    return logger


def str_to_torch_dtype(name: str) -> torch.dtype:
    """``'bfloat16'`` (or ``'torch.bfloat16'``) -> ``torch.bfloat16``."""
    key = name.removeprefix("torch.")
    if key not in _STR_TO_TORCH_DTYPE:
        raise ValueError(f"Unsupported dtype: {name}")
    return _STR_TO_TORCH_DTYPE[key]


def nbytes_of(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
