# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

from tt_kda.models.kimi_linear import (
    kimi_linear,
    kimi_linear_hf_to_tune,
    kimi_linear_tiny,
    kimi_linear_tune_to_hf,
)

__all__ = [
    "kimi_linear", "kimi_linear_hf_to_tune", "kimi_linear_tiny", "kimi_linear_tune_to_hf",
]
