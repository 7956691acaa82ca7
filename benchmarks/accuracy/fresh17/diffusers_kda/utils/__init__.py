"""Shared helpers: output containers, logging and a few stand-ins for optional dependencies."""

from __future__ import annotations

import logging as _logging
import os
from collections import OrderedDict
from dataclasses import fields, is_dataclass
from typing import Any, Dict, Iterable, Optional, Tuple

import torch

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.bin"
SAFETENSORS_WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"


class logging:  # noqa: N801 - mirrors ``diffusers.utils.logging``
    """The subset of ``diffusers.utils.logging`` the package uses."""

    @staticmethod
    def get_logger(name: Optional[str] = None) -> _logging.Logger:
        return _logging.getLogger(name or "diffusers_kda")


logger = logging.get_logger(__name__)


def is_safetensors_available() -> bool:
    return False


def is_accelerate_available() -> bool:
    return False


def _add_variant(weights_name: str, variant: Optional[str] = None) -> str:
    if variant is not None:
        stem, ext = weights_name.rsplit(".", 1)
        weights_name = f"{stem}.{variant}.{ext}"
    return weights_name


def save_file(tensors: Dict[str, torch.Tensor], filename: str, metadata: Optional[Dict[str, str]] = None) -> None:
    """Stand-in for ``safetensors.torch.save_file``: a flat dict of contiguous tensors."""
    payload = {name: tensor.detach().contiguous() for name, tensor in tensors.items()}
    with open(filename, "wb") as writer:
        torch.save({"__metadata__": dict(metadata or {}), "tensors": payload}, writer)


def load_file(filename: str, device: str = "cpu") -> Dict[str, torch.Tensor]:
    """Stand-in for ``safetensors.torch.load_file``: tensors come back in the dtype they were saved in."""
    with open(filename, "rb") as reader:
        archive = torch.load(reader, map_location=device, weights_only=True)
    return dict(archive["tensors"])


def progress_bar(iterable: Iterable, disable: bool = True) -> Iterable:
    """``tqdm`` stand-in; diffusers pipelines wrap their loops in one."""
    return iterable


class BaseOutput(OrderedDict):
    """Base class for model and pipeline outputs.

    A dataclass subclass of this behaves both as a dataclass (attribute access) and as an ordered
    dict (``output["sample"]``); fields set to ``None`` are left out of the dict view, as in
    diffusers, and ``output[0]`` is the first field that is set.
    """

    def __post_init__(self) -> None:
        if not is_dataclass(self):
            raise TypeError(f"{self.__class__.__name__} must be a dataclass")
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                super().__setitem__(field.name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return dict(self.items())[key]
        return self.to_tuple()[key]

    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(self[k] for k in self.keys())


def get_cache_dir() -> str:
    return os.environ.get("DIFFUSERS_KDA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "diffusers_kda"))
