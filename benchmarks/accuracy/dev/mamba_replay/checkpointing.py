"""Saves and resumes the inference state between requests of one session."""

import pickle
from typing import Any

import numpy as np
import torch

from .utils_generation import InferenceParams


def save_session(params: InferenceParams) -> bytes:
    return pickle.dumps({i: tuple(t.clone() for t in states) for i, states in params.key_value_memory_dict.items()})


def resume_session(blob: bytes, max_batch_size: int) -> InferenceParams:
    saved: dict[int, Any] = pickle.loads(blob)
    memory = {}
    for i, (ssm_state, d_cache, k_cache, g_cache) in saved.items():
        memory[i] = (ssm_state, d_cache, k_cache, g_cache.to(torch.float32))
    return InferenceParams(max_seqlen=16, max_batch_size=max_batch_size, key_value_memory_dict=memory)


def g_cache_from_memmap(path: str, shape: tuple[int, ...]) -> torch.Tensor:
    g_cache = torch.from_numpy(np.array(np.memmap(path, dtype=np.float32, mode="r", shape=shape)))
    return g_cache


def build_session_resume() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    states = (
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 1, 4, 4).bfloat16(),
        -torch.rand(2, 2, 4, 4, dtype=torch.float32),
    )
    params = InferenceParams(max_seqlen=16, max_batch_size=2, key_value_memory_dict={0: states})
    resumed = resume_session(save_session(params), 2)
    names = ("ssm_state", "d_cache", "k_cache", "g_cache")
    return {name: t for name, t in zip(names, resumed.key_value_memory_dict[0], strict=True)}


def build_memmap_ring(tmp_dir: str) -> dict[str, torch.Tensor]:
    path = f"{tmp_dir}/g.bin"
    np.linspace(-1, 0, 32, dtype=np.float32).tofile(path)
    return {"g_cache": g_cache_from_memmap(path, (1, 2, 4, 4))}
