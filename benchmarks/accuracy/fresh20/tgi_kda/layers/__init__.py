from .tensor_parallel import (
    FastLinear,
    FastRMSNorm,
    TensorParallelColumnLinear,
    TensorParallelEmbedding,
    TensorParallelHead,
    TensorParallelRowLinear,
)

__all__ = [
    "FastLinear",
    "FastRMSNorm",
    "TensorParallelColumnLinear",
    "TensorParallelEmbedding",
    "TensorParallelHead",
    "TensorParallelRowLinear",
]
