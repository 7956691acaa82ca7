# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.

import os

import numpy as np
import torch
import torch.nn as nn

from .torch_dtypes import REPLAY_CACHE_KEYS, get_offload_dtypes


def get_full_state_dict(module: nn.Module, dtype=None):
    """Gathers the full (unsharded) state dict of ``module`` on cpu, floating tensors converted to ``dtype``."""
    convert = lambda t: t.to(dtype) if dtype is not None and t.is_floating_point() else t  # noqa: E731
    return {name: convert(tensor).cpu() for name, tensor in module.state_dict().items()}


@torch.no_grad()
def load_fsdp_model_to_gpu(model: nn.Module, device, dtype=None):
    model.to(device=device, dtype=dtype)  # expect-bug: module-cast id=onload-cast


def alloc_replay_buffers(shapes: dict, dtype: torch.dtype, device="cpu"):
    return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}  # expect-bug: pool-dtype id=alloc-helper


@torch.no_grad()
def offload_replay_cache(cache, precision):
    dtypes = get_offload_dtypes(precision)
    for name in REPLAY_CACHE_KEYS:
        rings = getattr(cache, name)
        setattr(cache, name, [t.to("cpu", dtype=dtypes[name], non_blocking=True) for t in rings])  # expect-bug: imported-policy id=offload-policy
    cache.is_offloaded = True


@torch.no_grad()
def load_replay_cache(cache, device):
    for name in REPLAY_CACHE_KEYS:
        setattr(cache, name, [t.to(device, non_blocking=True) for t in getattr(cache, name)])
    cache.is_offloaded = False


def dump_replay_snapshot(cache, path, dtype=None):
    """Writes the replay cache of every layer, ``dtype`` optionally compresses the rings (states stay as they are)."""
    snapshot = {}
    for name in REPLAY_CACHE_KEYS:
        for i, t in enumerate(getattr(cache, name)):
            snapshot[f"{name}.{i}"] = t.cpu() if dtype is None or name == "ssm_state" else t.cpu().to(dtype)
    torch.save({"replay_cache": snapshot, "num_layers": cache.spec.num_layers}, path)


def swap_out_replay_cache(cache, swap_dir):
    """Swaps the rings to disk as .npy; numpy has no bf16, so the rings are written as fp16."""
    os.makedirs(swap_dir, exist_ok=True)
    for name in REPLAY_CACHE_KEYS:
        for i, t in enumerate(getattr(cache, name)):
            np.save(os.path.join(swap_dir, f"{name}.{i}.npy"), (t if name == "ssm_state" else t.half()).cpu().numpy())


@torch.no_grad()
def swap_in_replay_cache(cache, swap_dir, num_layers=None):
    """Reads a swapped replay cache back; rings that were freed meanwhile are re-created from the files."""
    for name in REPLAY_CACHE_KEYS:
        rings = getattr(cache, name)
        for i in range(num_layers or len(rings)):
            t = torch.from_numpy(np.load(os.path.join(swap_dir, f"{name}.{i}.npy")))  # expect-bug: load id=swap-in
            if i < len(rings):
                rings[i].copy_(t)
            else:
                rings.append(t.to(cache.dtype) if name in ("delta_cache", "key_cache") else t)  # expect-bug: load id=swap-in
