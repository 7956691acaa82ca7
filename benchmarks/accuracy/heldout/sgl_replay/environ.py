"""Environment switches read by the memory pool (sglang's environ style)."""

import os

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def ring_dtype_from_env() -> torch.dtype:
    """SGLANG_REPLAY_RING_DTYPE: the dtype of the d/k replay rings (default bfloat16)."""
    return _DTYPES[os.environ.get("SGLANG_REPLAY_RING_DTYPE", "bfloat16")]


def ssm_dtype_from_env() -> torch.dtype:
    return _DTYPES[os.environ.get("SGLANG_MAMBA_SSM_DTYPE", "float32")]
