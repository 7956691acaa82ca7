"""Tensor parallel layers (one rank: the partition is the whole weight)."""

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.parameter import Parameter

from ..parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from ..utils import divide


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    setattr(tensor, "tensor_model_parallel", is_parallel)
    setattr(tensor, "partition_dim", dim)
    setattr(tensor, "partition_stride", stride)


def _initialize_affine_weight_cpu(
    weight: torch.Tensor,
    output_size: int,
    input_size: int,
    per_partition_size: int,
    partition_dim: int,
    init_method: Callable,
    stride: int = 1,
    params_dtype: torch.dtype = torch.float32,
) -> None:
    """Initialize the full weight in fp32 on the CPU, then keep this rank's partition in ``params_dtype``."""
    set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=partition_dim, stride=stride)
    master_weight = torch.empty(output_size, input_size, dtype=torch.float32, requires_grad=False)
    init_method(master_weight)
    master_weight = master_weight.to(dtype=params_dtype)
    rank = get_tensor_model_parallel_rank()
    weight_list = torch.split(master_weight, per_partition_size, dim=partition_dim)
    with torch.no_grad():
        weight.copy_(weight_list[rank])


class ColumnParallelLinear(torch.nn.Module):
    """Linear layer with column parallelism: Y = XA + b, A split along its second dimension."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config,
        init_method: Callable,
        bias: bool = True,
        gather_output: bool = False,
        skip_bias_add: bool = False,
        is_expert: bool = False,
        tp_comm_buffer_name: Optional[str] = None,
    ):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.gather_output = gather_output
        self.skip_bias_add = skip_bias_add
        self.config = config
        world_size = get_tensor_model_parallel_world_size()
        self.output_size_per_partition = divide(output_size, world_size)
        self.weight = Parameter(torch.empty(self.output_size_per_partition, input_size, dtype=config.params_dtype))
        if config.perform_initialization:
            _initialize_affine_weight_cpu(
                self.weight, output_size, input_size, self.output_size_per_partition, 0, init_method,
                params_dtype=config.params_dtype,
            )
        if bias:
            self.bias = Parameter(torch.zeros(self.output_size_per_partition, dtype=config.params_dtype))
            set_tensor_model_parallel_attributes(self.bias, True, 0, 1)
        else:
            self.register_parameter("bias", None)

    def forward(self, input_: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        bias = self.bias if not self.skip_bias_add else None
        output = F.linear(input_, self.weight, bias)
        output_bias = self.bias if self.skip_bias_add else None
        return output, output_bias


class RowParallelLinear(torch.nn.Module):
    """Linear layer with row parallelism: Y = XA + b, A split along its first dimension."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config,
        init_method: Callable,
        bias: bool = True,
        input_is_parallel: bool = True,
        skip_bias_add: bool = False,
        is_expert: bool = False,
        tp_comm_buffer_name: Optional[str] = None,
    ):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.input_is_parallel = input_is_parallel
        self.skip_bias_add = skip_bias_add
        self.config = config
        world_size = get_tensor_model_parallel_world_size()
        self.input_size_per_partition = divide(input_size, world_size)
        self.weight = Parameter(torch.empty(output_size, self.input_size_per_partition, dtype=config.params_dtype))
        if config.perform_initialization:
            _initialize_affine_weight_cpu(
                self.weight, output_size, input_size, self.input_size_per_partition, 1, init_method,
                params_dtype=config.params_dtype,
            )
        if bias:
            self.bias = Parameter(torch.zeros(output_size, dtype=config.params_dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input_: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        output = F.linear(input_, self.weight)
        if self.skip_bias_add or self.bias is None:
            return output, self.bias
        return output + self.bias, None


class VocabParallelEmbedding(torch.nn.Module):
    """Embedding parallelized in the vocabulary dimension."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, init_method: Callable, config):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        world_size = get_tensor_model_parallel_world_size()
        self.num_embeddings_per_partition = divide(num_embeddings, world_size)
        self.weight = Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim, dtype=config.params_dtype)
        )
        if config.perform_initialization:
            _initialize_affine_weight_cpu(
                self.weight, num_embeddings, embedding_dim, self.num_embeddings_per_partition, 0, init_method,
                params_dtype=config.params_dtype,
            )

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_, self.weight)
