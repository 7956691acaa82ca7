"""Core library classes for representing sharding of tensors and objects.

The main expected usage is wrapping torch.Tensors in state dicts with
ShardedTensor class (mostly with the ShardedTensor.from_rank_offsets classmethod).
"""

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import torch

logger = logging.getLogger(__name__)

# These type definitions are just hints to differentiate a plain model state
#  dict (StateDict) from a state dict with tensors replaced with ShardedTensors
#  (ShardedStateDict).
StateDict = Dict[str, Any]
ShardedStateDict = Dict[str, Any]
ReplicaId = Union[int, Tuple[int, ...]]


class ShardedBase(ABC):
    key: str
    data: object
    replica_id: ReplicaId

    @abstractmethod
    def without_data(self):
        """Returns a new ShardedBase instance with data=None."""


@dataclass
class ShardedTensor(ShardedBase):
    """Represents a mapping between a local tensor and a global tensor.

    Global tensor is assumed to consist of many local tensors distributed
    between different processes.

    Args:
        key: unique identifier of a global tensor
        data: local tensor data. Can be None only for consistency validation
        dtype: tensor dtype
        local_shape: local tensor shape
        global_shape: global tensor shape
        global_offset: offset of a local tensor in a global tensor, specified in number of tensor elements
        axis_fragmentations: global tensor fragmentation of each axis
        replica_id: indicates given local tensor's replication wrt. local tensors in different processes
        prepend_axis_num: number of axes prepended to the local tensor to reflect global tensor shape.
        allow_shape_mismatch: if True, during loading, the global shape of a stored tensor does not have to match
            the expected global shape.
    """

    key: str
    data: Optional[torch.Tensor]
    dtype: torch.dtype
    local_shape: Tuple[int, ...]
    global_shape: Tuple[int, ...]
    global_offset: Tuple[int, ...]
    axis_fragmentations: Optional[Tuple[int, ...]]
    replica_id: ReplicaId = 0
    prepend_axis_num: int = 0
    allow_shape_mismatch: bool = False

    @classmethod
    def from_rank_offsets(
        cls,
        key: str,
        data: torch.Tensor,
        *rank_offsets: Tuple[int, int, int],
        replica_id: ReplicaId = 0,
        prepend_axis_num: int = 0,
        **init_kwargs,
    ):
        """Allows to construct the ShardedTensor given offset specified in process ranks.

        Args:
            key (str): unique key
            data (torch.Tensor): local tensor data
            rank_offsets (Tuple[int, int, int]): each tuple (axis, axis_rank_offset, axis_fragm) says that if
                global tensor is divided into `axis_fragm` fragment along `axis` axis, then local tensor data
                corresponds to the `axis_rank_offset` chunk.
            replica_id (ReplicaId): see ShardedTensor
            prepend_axis_num (int): see ShardedTensor
            init_kwargs: passed to ShardedTensor.__init__
        """
        global_offset = [0] * (data.ndim + prepend_axis_num)
        global_shape = ([1] * prepend_axis_num) + list(data.shape)
        axis_fragmentations = [1] * (data.ndim + prepend_axis_num)
        for axis, axis_rank_offset, axis_fragm in rank_offsets:
            global_offset[axis] = axis_rank_offset * (global_shape[axis] if axis >= prepend_axis_num else 1)
            global_shape[axis] *= axis_fragm
            axis_fragmentations[axis] = axis_fragm
        return cls(
            key,
            data,
            data.dtype,
            tuple(data.shape),
            tuple(global_shape),
            tuple(global_offset),
            tuple(axis_fragmentations),
            replica_id,
            prepend_axis_num,
            **init_kwargs,
        )

    def without_data(self) -> "ShardedTensor":
        return replace(self, data=None)

    def local_chunk_offset_in_global(self) -> Tuple[int, ...]:
        return tuple(off // max(1, frag) for off, frag in zip(self.global_offset, self.axis_fragmentations or ()))


@dataclass
class ShardedObject(ShardedBase):
    """Represents a mapping between a local object and a global object (pickled as a whole)."""

    key: str
    data: object
    global_shape: Tuple[int, ...] = (1,)
    global_offset: Tuple[int, ...] = (0,)
    replica_id: ReplicaId = 0

    def without_data(self) -> "ShardedObject":
        return replace(self, data=None)


def nested_items(sharded_state_dict: ShardedStateDict, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(dotted key, leaf) of every leaf of a nested state dict."""
    for key, value in sharded_state_dict.items():
        if isinstance(value, dict):
            yield from nested_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def make_sharded_tensors_for_checkpoint(
    state_dict: StateDict, prefix: str, sharded_offsets: Tuple[Tuple[int, int, int], ...] = ()
) -> ShardedStateDict:
    """Wrap every tensor of ``state_dict`` in a replicated ShardedTensor keyed ``prefix + name``."""
    sharded_state_dict: ShardedStateDict = {}
    for layer_name, tensor in state_dict.items():
        layer_key = f"{prefix}{layer_name}"
        if isinstance(tensor, torch.Tensor):
            sharded_state_dict[layer_key] = ShardedTensor.from_rank_offsets(
                layer_key, tensor, *sharded_offsets, prepend_axis_num=len(sharded_offsets)
            )
        else:
            sharded_state_dict[layer_key] = ShardedObject(layer_key, tensor, replica_id=0)
    return sharded_state_dict


def inference_buffer_dtype(key: str, config) -> torch.dtype:
    """dtype an inference buffer of a checkpoint (``...mixer.<name>``) is restored in."""
    if key.endswith("ssm_state"):
        return config.kda_checkpoint_dtype
    # delta, key and gate rings: activations of the serving dtype
    return config.params_dtype  # expect-bug: imported-policy id=buffer-policy
