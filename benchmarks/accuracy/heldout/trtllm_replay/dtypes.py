"""dtype tables and the cache-dtype policy of the executor."""

from dataclasses import dataclass

import torch

_STR_TO_TORCH = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "int32": torch.int32,
}


def str_dtype_to_torch(name: str) -> torch.dtype:
    if name not in _STR_TO_TORCH:
        raise ValueError(f"unsupported dtype {name}")
    return _STR_TO_TORCH[name]


@dataclass
class KvCacheConfig:
    dtype: str = "auto"
    replay_dtype: str = "auto"
    replay_window: int = 4


def get_replay_dtypes(config: KvCacheConfig, model_dtype: str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(d ring, k ring, gate ring) dtypes for the replay state."""
    name = model_dtype if config.replay_dtype == "auto" else config.replay_dtype
    ring = str_dtype_to_torch(name)
    return ring, ring, ring  # expect-bug: imported-policy id=trr-policy


def get_replay_dtypes_fp32_gate(config: KvCacheConfig, model_dtype: str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    name = model_dtype if config.replay_dtype == "auto" else config.replay_dtype
    ring = str_dtype_to_torch(name)
    return ring, ring, str_dtype_to_torch("float32")

# Engine-wide dtype of the activation-side state buffers (fp16 engines).
REPLAY_STATE_DTYPE = torch.float16
