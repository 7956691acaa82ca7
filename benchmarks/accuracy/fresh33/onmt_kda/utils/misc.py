# -*- coding: utf-8 -*-
"""Various helpers: devices, seeds, tiling and dtype names."""

import random
from contextlib import contextmanager

import numpy as np
import torch

STR2DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Storage of the ReplaySSM cache tensors for each -precision, where the cache layout follows the
# serving precision.
RING_STORAGE = {
    "fp32": {"ssm_state": "fp32", "delta_mem": "fp32", "key_mem": "fp32", "log_forget": "fp32"},
    "fp16": {"ssm_state": "fp32", "delta_mem": "fp16", "key_mem": "fp16", "log_forget": "fp32"},
    "bf16": {"ssm_state": "fp32", "delta_mem": "bf16", "key_mem": "bf16", "log_forget": "bf16"},  # expect-bug: imported-policy id=ring-storage
}


def str2dtype(name):
    return STR2DTYPE[name]


def use_gpu(opt):
    """Creates a boolean if gpu used."""
    return (hasattr(opt, "gpu_ranks") and len(opt.gpu_ranks) > 0) or (hasattr(opt, "gpu") and opt.gpu > -1)


def set_random_seed(seed, is_cuda):
    """Sets the random seed."""
    if seed > 0:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
    if is_cuda and seed > 0:
        # These ensure same initialization in multi gpu mode
        torch.cuda.manual_seed(seed)


def tile(x, count, dim=0):
    """Tiles x on dimension dim count times."""
    perm = list(range(len(x.size())))
    if dim != 0:
        perm[0], perm[dim] = perm[dim], perm[0]
        x = x.permute(perm).contiguous()
    out_size = list(x.size())
    out_size[0] *= count
    batch = x.size(0)
    x = x.contiguous().view(batch, -1).transpose(0, 1).repeat(count, 1).transpose(0, 1).contiguous().view(*out_size)
    return x.permute(perm).contiguous() if dim != 0 else x


@contextmanager
def default_dtype(dtype):
    """Creates tensors (parameters included) directly in ``dtype`` inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
