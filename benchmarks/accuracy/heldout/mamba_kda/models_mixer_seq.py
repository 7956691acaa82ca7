"""The LM that stacks KDA mixers; builds caches for generation and CUDA graphs."""

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from .modules.kda_mixer import STEP_ARGS, KDAMixer, decay_cache_from_dump, decay_cache_from_dump_fp32
from .utils.generation import InferenceParams


class MixerModel(nn.Module):
    def __init__(self, d_model: int = 8, n_layer: int = 2, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList([KDAMixer(d_model, layer_idx=i, dtype=dtype) for i in range(n_layer)])

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None) -> dict[int, Any]:
        return {i: layer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype) for i, layer in enumerate(self.layers)}

    def allocate_inference_cache_fp32_decay(self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None) -> dict[int, Any]:
        caches = {}
        for i, layer in enumerate(self.layers):
            ssm_state, d_cache, k_cache, decay_cache = layer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype)
            caches[i] = (ssm_state, d_cache, k_cache, decay_cache.to(torch.float32))
        return caches


@contextlib.contextmanager
def torch_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def setup_generation(dtype: torch.dtype, batch_size: int) -> tuple[MixerModel, list[torch.Tensor]]:
    with torch_default_dtype(dtype):
        model = MixerModel()
        decay_caches = [torch.full((batch_size, 2, 4, 4), 0.0) for _ in model.layers]  # expect-bug: default-dtype
    return model, decay_caches


def setup_generation_fp32_decay(dtype: torch.dtype, batch_size: int) -> tuple[MixerModel, list[torch.Tensor]]:
    with torch_default_dtype(dtype):
        model = MixerModel()
        decay_caches = [torch.full((batch_size, 2, 4, 4), 0.0, dtype=torch.float32) for _ in model.layers]
    return model, decay_caches


def seed_decay_cache(step_log_decays: list[torch.Tensor]) -> torch.Tensor:
    """step_log_decays: the last ring-length steps of the prefill, each [batch, heads, dim]."""
    decay_cache = torch.stack(step_log_decays, dim=2) * 1.0  # expect-bug: promotion
    return decay_cache


def seed_decay_cache_fp32(step_log_decays: list[torch.Tensor]) -> torch.Tensor:
    zero = torch.zeros((), dtype=torch.float32)
    decay_cache = torch.stack(step_log_decays, dim=2) + zero.expand(1, 1, 1, 1)
    return decay_cache


def _flat(caches: dict[int, Any]) -> dict[str, torch.Tensor]:
    names = ("ssm_state", "d_cache", "k_cache", "decay_cache")
    return {f"{i}.{n}": t for i, states in caches.items() for n, t in zip(names, states)}


def _steps() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [(-torch.rand(2, 2, 4)).bfloat16() for _ in range(4)]


def build_inference_cache() -> dict[str, torch.Tensor]:
    return _flat(MixerModel(dtype=torch.bfloat16).allocate_inference_cache(2, 8))


def build_inference_cache_fp32_decay() -> dict[str, torch.Tensor]:
    return _flat(MixerModel(dtype=torch.bfloat16).allocate_inference_cache_fp32_decay(2, 8))


def build_step_states() -> dict[str, torch.Tensor]:
    model, params = MixerModel(dtype=torch.bfloat16), InferenceParams(8, 2)
    for layer in model.layers:
        assert isinstance(layer, KDAMixer)
        layer.step(torch.randn(2, 1, 8).bfloat16(), params)
    return _flat(params.key_value_memory_dict) | {"step_decay_cache": STEP_ARGS["decay_cache"]}


def build_generation_rings() -> dict[str, object]:
    return {"decay_caches": setup_generation(torch.bfloat16, 2)[1]}


def build_generation_rings_fp32() -> dict[str, object]:
    return {"decay_caches": setup_generation_fp32_decay(torch.bfloat16, 2)[1]}


def build_seed_decay_cache() -> dict[str, torch.Tensor]:
    return {"decay_cache": seed_decay_cache(_steps())}


def build_seed_decay_cache_fp32() -> dict[str, torch.Tensor]:
    return {"decay_cache": seed_decay_cache_fp32(_steps())}


def build_dump_bf16(tmp_dir: str) -> dict[str, torch.Tensor]:
    np.save(f"{tmp_dir}/ring.npy", np.linspace(-1, 0, 32, dtype=np.float32).reshape(1, 2, 4, 4))
    return {"decay_cache": decay_cache_from_dump(f"{tmp_dir}/ring.npy", torch.bfloat16)}


def build_dump_fp32(tmp_dir: str) -> dict[str, torch.Tensor]:
    np.save(f"{tmp_dir}/ring.npy", np.linspace(-1, 0, 32, dtype=np.float64).reshape(1, 2, 4, 4))
    return {"decay_cache": decay_cache_from_dump_fp32(f"{tmp_dir}/ring.npy")}
