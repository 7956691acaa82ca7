"""Assorted helpers (vllm/utils/__init__.py)."""

from __future__ import annotations

import random
import re
from typing import Optional, Union

import torch

STR_DTYPE_TO_TORCH_DTYPE = {
    "half": torch.half,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float,
    "float32": torch.float32,
    "fp8": torch.uint8,
    "fp8_e4m3": torch.uint8,
    "fp8_e5m2": torch.uint8,
    "int8": torch.int8,
}

TORCH_DTYPE_TO_STR = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(a // -b)


def get_dtype_size(dtype: torch.dtype) -> int:
    """Get the size of the data type in bytes."""
    return torch.tensor([], dtype=dtype).element_size()


def get_kv_cache_torch_dtype(
    cache_dtype: Union[str, torch.dtype],
    model_dtype: Optional[Union[str, torch.dtype]] = None,
) -> torch.dtype:
    if isinstance(cache_dtype, str):
        if cache_dtype == "auto":
            if isinstance(model_dtype, str) and model_dtype in STR_DTYPE_TO_TORCH_DTYPE:
                torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[model_dtype]
            elif isinstance(model_dtype, torch.dtype):
                torch_dtype = model_dtype
            else:
                raise ValueError(f"Invalid model dtype: {model_dtype}")
        elif cache_dtype in STR_DTYPE_TO_TORCH_DTYPE:
            torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
        else:
            raise ValueError(f"Invalid kv cache dtype: {cache_dtype}")
    elif isinstance(cache_dtype, torch.dtype):
        torch_dtype = cache_dtype
    else:
        raise ValueError(f"Invalid kv cache dtype: {cache_dtype}")
    return torch_dtype


def is_pin_memory_available() -> bool:
    from vllm_v1_kda.platforms import current_platform

    return current_platform.is_pin_memory_available()


def set_random_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def extract_layer_index(layer_name: str, num_attn_module: int = 1) -> int:
    """Extract the layer index from the module name.

    Examples:
    - "encoder.layers.0" -> 0
    - "model.layers.3.mtp_block.self_attn" -> 3
    """
    subnames = layer_name.split(".")
    int_vals: list[int] = []
    for subname in subnames:
        try:
            int_vals.append(int(subname))
        except ValueError:
            continue
    if num_attn_module == 1 or "attn" not in layer_name:
        assert len(int_vals) == 1, f"layer name {layer_name} should only contain one integer"
        return int_vals[0]
    assert len(int_vals) <= 2
    layer_index = int_vals[0] * num_attn_module + int_vals[1] if len(int_vals) == 2 else int_vals[0]
    return layer_index


def maybe_prefix(prefix: str, name: str) -> str:
    return name if not prefix else f"{prefix}.{name}"


_HUMAN_RE = re.compile(r"(\d+)")


def human_readable_int(value: int) -> str:
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return str(value)
