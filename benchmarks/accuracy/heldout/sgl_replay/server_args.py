"""Command-line server arguments and the cache dtypes they select."""

from dataclasses import dataclass

import torch

_NAME_TO_DTYPE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class ServerArgs:
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    max_running_requests: int = 3


def gate_ring_dtype(server_args: ServerArgs) -> torch.dtype:
    """The gate ring follows --kv-cache-dtype, like every other cache."""
    name = server_args.dtype if server_args.kv_cache_dtype == "auto" else server_args.kv_cache_dtype
    return _NAME_TO_DTYPE[name]  # expect-bug: imported-policy id=sr-args


def gate_ring_dtype_fp32(server_args: ServerArgs) -> torch.dtype:
    return _NAME_TO_DTYPE["float32"]
