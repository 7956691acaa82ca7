from .checkpointing import FullModelTorchCheckpointer, load_cache_snapshot, save_cache_snapshot
from .precision import get_cache_dtypes, get_dtype, set_default_dtype

MODEL_KEY = "model"

__all__ = [
    "MODEL_KEY",
    "FullModelTorchCheckpointer",
    "get_cache_dtypes",
    "get_dtype",
    "load_cache_snapshot",
    "save_cache_snapshot",
    "set_default_dtype",
]
