# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

"""Single-process stand-ins for the fairscale model-parallel layers.

The reference code is written against ``fairscale.nn.model_parallel``; on one CPU process the
parallel layers reduce to their ``torch.nn`` counterparts, which is what this module provides.
"""

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn


def get_model_parallel_rank() -> int:
    return 0


def get_model_parallel_world_size() -> int:
    return 1


def initialize_model_parallel(model_parallel_size: int = 1) -> None:
    if model_parallel_size != 1:
        raise ValueError(f"only a model parallel size of 1 is available here, got {model_parallel_size}")


def model_parallel_is_initialized() -> bool:
    return True


class ColumnParallelLinear(nn.Linear):
    """``Y = XA`` with ``A`` split by columns; one shard on a single process."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        gather_output: bool = False,
        init_method: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.gather_output = gather_output


class RowParallelLinear(nn.Linear):
    """``Y = XA`` with ``A`` split by rows; one shard on a single process."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        input_is_parallel: bool = False,
        init_method: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.input_is_parallel = input_is_parallel


class VocabParallelEmbedding(nn.Embedding):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        init_method: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets torch's default floating point dtype for the body and restores it afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
