"""Model and data parallel groups.

This package runs a single rank: every getter answers as ``torch.distributed`` would for a world of
size one, so that the code written against ``parallel_state`` keeps its shape.
"""

from typing import Optional

_TENSOR_MODEL_PARALLEL_GROUP = None
_PIPELINE_MODEL_PARALLEL_GROUP = None
_DATA_PARALLEL_GROUP = None
_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE: Optional[int] = None
_MPU_TENSOR_MODEL_PARALLEL_RANK: Optional[int] = None


def model_parallel_is_initialized() -> bool:
    """Whether the parallel groups exist (always, for one rank)."""
    return True


def initialize_model_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1) -> None:
    if tensor_model_parallel_size != 1 or pipeline_model_parallel_size != 1:
        raise RuntimeError("mcore_kda runs on a single rank: tensor and pipeline parallel sizes must be 1")


def get_tensor_model_parallel_group(check_initialized: bool = True):
    return _TENSOR_MODEL_PARALLEL_GROUP


def get_tensor_model_parallel_world_size() -> int:
    if _MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE is not None:
        return _MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE
    return 1


def get_tensor_model_parallel_rank() -> int:
    if _MPU_TENSOR_MODEL_PARALLEL_RANK is not None:
        return _MPU_TENSOR_MODEL_PARALLEL_RANK
    return 0


def get_pipeline_model_parallel_world_size() -> int:
    return 1


def get_pipeline_model_parallel_rank() -> int:
    return 0


def is_pipeline_first_stage(ignore_virtual: bool = False) -> bool:
    return True


def is_pipeline_last_stage(ignore_virtual: bool = False) -> bool:
    return True


def get_data_parallel_rank(with_context_parallel: bool = False) -> int:
    return 0


def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
    return 1
