"""Session persistence: the inference state of a conversation, saved between turns."""

import io
from typing import Any

import numpy as np
import torch

from .generation import InferenceParams


def save(params: InferenceParams) -> bytes:
    buffer = io.BytesIO()
    torch.save(params.key_value_memory_dict, buffer)
    return buffer.getvalue()


def load(raw: bytes, batch: int) -> InferenceParams:
    saved: dict[int, Any] = torch.load(io.BytesIO(raw), weights_only=True)
    restored = {}
    for layer, (ssm_state, d_cache, k_cache, decay_cache) in saved.items():
        restored[layer] = (ssm_state, d_cache, k_cache, decay_cache.float())
    return InferenceParams(max_seqlen=8, max_batch_size=batch, key_value_memory_dict=restored)


def decay_cache_from_npy(path: str) -> torch.Tensor:
    decay_cache = torch.from_numpy(np.load(path).astype(np.float32))
    return decay_cache


def build_session_roundtrip() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    states = (
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 1, 4, 4).bfloat16(),
        -torch.rand(2, 2, 4, 4),
    )
    loaded = load(save(InferenceParams(8, 2, key_value_memory_dict={1: states})), 2)
    names = ("ssm_state", "d_cache", "k_cache", "decay_cache")
    return dict(zip(names, loaded.key_value_memory_dict[1], strict=True))


def build_npy_ring(tmp_dir: str) -> dict[str, torch.Tensor]:
    np.save(f"{tmp_dir}/decay.npy", np.linspace(-1, 0, 32).reshape(1, 2, 4, 4))
    return {"decay_cache": decay_cache_from_npy(f"{tmp_dir}/decay.npy")}
