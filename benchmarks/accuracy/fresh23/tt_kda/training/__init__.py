# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

import random
from typing import Optional

import numpy as np
import torch

from tt_kda.training.checkpointing import (
    FullModelHFCheckpointer,
    FullModelTorchTuneCheckpointer,
    safe_torch_load,
)
from tt_kda.training.precision import (
    FULL_PRECISION_CACHE_BUFFERS,
    PRECISION_STR_TO_DTYPE,
    cache_dtype_for,
    get_dtype,
    set_default_dtype,
    validate_expected_param_dtype,
)

MODEL_KEY = "model"
CACHES_KEY = "caches"


def set_seed(seed: Optional[int] = None) -> int:
    """Seeds Python, NumPy and torch; returns the seed used (``0`` when none is given)."""
    seed = 0 if seed is None else int(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


__all__ = [
    "CACHES_KEY", "FULL_PRECISION_CACHE_BUFFERS", "FullModelHFCheckpointer",
    "FullModelTorchTuneCheckpointer", "MODEL_KEY", "PRECISION_STR_TO_DTYPE", "cache_dtype_for",
    "get_dtype", "safe_torch_load", "set_default_dtype", "set_seed",
    "validate_expected_param_dtype",
]
