# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Helpers around ``torch.distributed`` that also work in a single, uninitialised process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed

__all__ = [
    "barrier",
    "get_global_rank",
    "get_local_rank",
    "get_world_size",
    "is_initialized",
    "local_rank_zero_download_and_convert",
]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def get_world_size() -> int:
    return torch.distributed.get_world_size() if is_initialized() else _env_int("WORLD_SIZE", 1)


def get_global_rank() -> int:
    return torch.distributed.get_rank() if is_initialized() else _env_int("RANK", 0)


def get_local_rank() -> int:
    return _env_int("LOCAL_RANK", 0)


def barrier() -> None:
    if is_initialized():
        torch.distributed.barrier()


@contextlib.contextmanager
def local_rank_zero_download_and_convert() -> Iterator[None]:
    """Lets local rank zero fetch or convert files first while the other local ranks wait."""
    if get_local_rank() != 0:
        barrier()
    yield
    if get_local_rank() == 0:
        barrier()
