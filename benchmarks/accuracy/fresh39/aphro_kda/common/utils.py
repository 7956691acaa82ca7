"""Small helpers shared by the engine, the workers and the serving layer."""
import os
import platform
import uuid
from functools import lru_cache
from typing import Dict, Optional, Tuple, Union

import torch

from .logger import init_logger

logger = init_logger(__name__)

STR_DTYPE_TO_TORCH_DTYPE: Dict[str, torch.dtype] = {
    "half": torch.half,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float,
    "float32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
}

# Names of the per-layer tensors a KDA cache block holds, in kernel order.
KDA_RING_NAMES: Tuple[str, ...] = ("ssm_state", "delta_cache", "key_cache", "alpha_log_cache")
# Tensors that are never stored narrower than float32, whatever ``cache_dtype`` says.
FP32_RINGS: Tuple[str, ...] = ("ssm_state",)  # expect-bug: imported-policy id=fp32-rings


def random_uuid() -> str:
    return str(uuid.uuid4().hex)


@lru_cache(maxsize=None)
def in_wsl() -> bool:
    return "microsoft" in " ".join(platform.uname()).lower()


@lru_cache(maxsize=None)
def is_pin_memory_available() -> bool:
    if in_wsl():
        logger.warning("Using 'pin_memory=False' as WSL is detected. This may slow down the performance.")
        return False
    if not torch.cuda.is_available():
        return False
    return os.environ.get("APHRODITE_DISABLE_PIN_MEMORY", "0") != "1"


def get_dtype_size(dtype: torch.dtype) -> int:
    """Size of one element of ``dtype`` in bytes."""
    return torch.tensor([], dtype=dtype).element_size()


def get_kv_cache_torch_dtype(
    cache_dtype: Optional[Union[str, torch.dtype]],
    model_dtype: Optional[Union[str, torch.dtype]] = None,
) -> torch.dtype:
    """Resolves ``--kv-cache-dtype`` ("auto" follows the model) to a torch dtype."""
    if isinstance(cache_dtype, torch.dtype):
        return cache_dtype
    if cache_dtype is None or cache_dtype == "auto":
        if isinstance(model_dtype, str):
            return STR_DTYPE_TO_TORCH_DTYPE[model_dtype]
        if isinstance(model_dtype, torch.dtype):
            return model_dtype
        raise ValueError(f"Invalid model dtype: {model_dtype}")
    if cache_dtype in STR_DTYPE_TO_TORCH_DTYPE:
        return STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
    raise ValueError(f"Invalid kv cache dtype: {cache_dtype}")


def get_ring_storage_dtype(ring: str, cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """Host-side storage dtype of one KDA ring (used for swap and snapshot buffers)."""
    if ring in FP32_RINGS:
        return torch.float32
    storage = get_kv_cache_torch_dtype(cache_dtype, model_dtype)
    # fp8/int8 are a GPU-kernel feature; host copies keep the compute dtype.
    return model_dtype if storage in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8) else storage
