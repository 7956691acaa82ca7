"""Common utilities for nanochat."""

import os
from contextlib import contextmanager

import torch

# nanoGPT-style dtype strings, as they appear in the configs and checkpoint metadata
DTYPE_MAP = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def print0(s="", **kwargs):
    ddp_rank = int(os.environ.get("RANK", 0))
    if ddp_rank == 0:
        print(s, **kwargs)


def compute_init(device_type="cpu", seed=42, dtype=None):
    torch.manual_seed(seed)
    if device_type == "cuda":
        torch.cuda.manual_seed(seed)
        torch.set_float32_matmul_precision("high") # uses tf32 instead of fp32 for matmuls
    if dtype is not None: # e.g. bf16 inference on cpu: new tensors and modules come out in the compute dtype
        torch.set_default_dtype(dtype) # expect-bug: default-dtype id=global-default
    return torch.device(device_type)


def compute_dtype(device_type, dtype=None):
    # the activation / weight dtype we run in: bf16 wherever it is supported
    if dtype is None:
        return torch.bfloat16 if device_type in ("cuda", "cpu") else torch.float32
    return DTYPE_MAP[dtype] if isinstance(dtype, str) else dtype


def ring_dtypes(dtype):
    # dtypes of the replay rings: d and k follow the activations, the log-decay ring is always fp32
    return {"d_cache": dtype, "k_cache": dtype, "la_cache": torch.float32, "s_cache": torch.float32}


@contextmanager
def default_dtype(dtype):
    # temporarily change torch's default dtype (e.g. to materialize a model directly in bf16)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)
