"""Small stand-ins for the parts of ``transformers`` and ``accelerate`` that KTransformers leans on.

Only what this package needs: a ``PretrainedConfig`` with attribute-style fields, the meta-device
``init_empty_weights`` context and a logger factory.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any, Iterator

import torch

__all__ = ["PretrainedConfig", "get_logger", "init_empty_weights"]


def get_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


class PretrainedConfig:
    """Attribute bag with ``to_dict``/``from_dict``; ``torch_dtype`` is kept as the checkpoint's string."""

    model_type: str = ""

    def __init__(self, torch_dtype: str = "float32", **kwargs: Any) -> None:
        self.torch_dtype = torch_dtype
        for key, value in kwargs.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        output = copy.deepcopy(self.__dict__)
        output["model_type"] = self.model_type
        return output

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "PretrainedConfig":
        merged = {k: v for k, v in config_dict.items() if k != "model_type"}
        merged.update(kwargs)
        return cls(**merged)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()))
        return f"{type(self).__name__}({fields})"


@contextlib.contextmanager
def init_empty_weights() -> Iterator[None]:
    """Parameters and buffers created inside the block land on the meta device (no storage)."""
    with torch.device("meta"):
        yield
