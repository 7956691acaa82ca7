# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.
"""Device and logging helpers shared by the recipes."""

import logging
import os
from typing import Optional, Union

import torch

_LOGGER_NAME = "tt_kda"


def get_logger(level: Optional[str] = None) -> logging.Logger:
    """Returns the package logger, configured once with a plain stream handler.

    Args:
        level (Optional[str]): a logging level name such as ``"INFO"``; ``None`` keeps the
            current level.
    """
    logger = logging.getLogger(_LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    if level is not None:
        logger.setLevel(getattr(logging, level.upper()))
    return logger


def get_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """Resolves the device a recipe runs on.

    ``None`` picks CUDA when it is available and the CPU otherwise; a bare ``"cuda"`` gets the
    GPU of the local rank (``LOCAL_RANK`` under torchrun).

    Raises:
        RuntimeError: if CUDA is requested but not available.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA was requested but is not available")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return device
