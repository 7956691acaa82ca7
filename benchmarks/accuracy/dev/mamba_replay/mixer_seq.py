"""The LM that stacks mixers and hands out their inference caches."""

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from .mixer import KDAMixer, gate_ring_from_numpy, gate_ring_from_numpy_fp32
from .utils_generation import DecodingCGCache, InferenceParams


class MixerModel(nn.Module):
    def __init__(self, d_model: int = 8, n_layer: int = 2, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [KDAMixer(d_model, layer_idx=i, dtype=dtype) for i in range(n_layer)]
        )

    def allocate_inference_cache(
        self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None, **kwargs: Any
    ) -> dict[int, Any]:
        return {
            i: layer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype, **kwargs)
            for i, layer in enumerate(self.layers)
        }

    def allocate_inference_cache_fp32_gates(
        self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None
    ) -> dict[int, Any]:
        caches = self.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype)
        for i, (ssm_state, d_cache, k_cache, g_cache) in caches.items():
            caches[i] = (ssm_state, d_cache, k_cache, g_cache.float())
        return caches


def update_graph_cache(
    model: MixerModel, cache: Optional[DecodingCGCache], batch_size: int, seqlen: int,
    dtype: torch.dtype,
) -> DecodingCGCache:
    if cache is None:
        cache = DecodingCGCache()
    if (cache.device, cache.dtype) != (None, dtype) or batch_size > cache.max_batch_size:
        cache.max_batch_size, cache.max_seqlen, cache.dtype = batch_size, seqlen, dtype
        inf_cache = model.allocate_inference_cache_fp32_gates(batch_size, seqlen, dtype)
        cache.inference_params = InferenceParams(
            max_seqlen=seqlen, max_batch_size=batch_size, key_value_memory_dict=inf_cache
        )
    return cache


def stacked_gate_rings(caches: dict[int, Any]) -> torch.Tensor:
    """One [layers, batch, heads, ring, dim] view for the fused multi-layer kernel."""
    g_caches = torch.stack([cache[3] for cache in caches.values()])
    return g_caches


def seed_gate_ring_from_prefill(g: torch.Tensor, ring_len: int) -> torch.Tensor:
    """g: [batch, seqlen, nheads, headdim] log-decays of the prefill, in the activation dtype."""
    tail = g[:, -(ring_len - 1) :].transpose(1, 2)
    pad = tail.new_zeros(tail.shape[0], tail.shape[1], 1, tail.shape[3])
    g_cache = torch.cat([tail, pad], dim=2)  # expect-bug: promotion
    return g_cache


def seed_gate_ring_from_prefill_fp32(g: torch.Tensor, ring_len: int) -> torch.Tensor:
    tail = g[:, -(ring_len - 1) :].transpose(1, 2)
    pad = tail.new_zeros(tail.shape[0], tail.shape[1], 1, tail.shape[3])
    # cat promotes to the widest operand: float32.
    g_cache = torch.cat([tail.float(), pad], dim=2)
    return g_cache


def stacked_gate_rings_fp32(caches: dict[int, Any]) -> torch.Tensor:
    g_caches = torch.stack([cache[3].float() for cache in caches.values()])
    return g_caches


def _flat(caches: dict[int, Any]) -> dict[str, torch.Tensor]:
    names = ("ssm_state", "d_cache", "k_cache", "g_cache")
    return {f"{i}.{name}": t for i, states in caches.items() for name, t in zip(names, states)}


def build_inference_cache_bf16() -> dict[str, torch.Tensor]:
    return _flat(MixerModel(dtype=torch.bfloat16).allocate_inference_cache(2, 16))


def build_graph_cache_fp32_gates() -> dict[str, torch.Tensor]:
    cache = update_graph_cache(MixerModel(dtype=torch.bfloat16), None, 2, 16, torch.bfloat16)
    assert cache.inference_params is not None
    return _flat(cache.inference_params.key_value_memory_dict)


def build_step_states_bf16() -> dict[str, torch.Tensor]:
    model = MixerModel(dtype=torch.bfloat16)
    params = InferenceParams(max_seqlen=16, max_batch_size=2)
    for layer in model.layers:
        assert isinstance(layer, KDAMixer)
        layer.step(torch.randn(2, 1, 8, dtype=torch.bfloat16), params)
    return _flat(params.key_value_memory_dict)


def build_stacked_rings() -> dict[str, torch.Tensor]:
    caches = MixerModel(dtype=torch.bfloat16).allocate_inference_cache_fp32_gates(2, 16)
    return {"g_caches": stacked_gate_rings(caches), "g_caches_fp32": stacked_gate_rings_fp32(caches)}


def build_profiler_warm_start() -> dict[str, torch.Tensor]:
    dump = np.linspace(-1.0, 0.0, 2 * 2 * 4 * 4, dtype=np.float32).reshape(2, 2, 4, 4)
    return {"g_cache": gate_ring_from_numpy(dump, torch.bfloat16)}


def build_profiler_warm_start_fp32() -> dict[str, torch.Tensor]:
    dump = np.linspace(-1.0, 0.0, 2 * 2 * 4 * 4, dtype=np.float64).reshape(2, 2, 4, 4)
    return {"g_cache": gate_ring_from_numpy_fp32(dump)}


def _prefill_gates() -> torch.Tensor:
    torch.manual_seed(0)
    return -torch.rand(2, 6, 2, 4).to(torch.bfloat16)


def build_prefill_seed() -> dict[str, torch.Tensor]:
    return {"g_cache": seed_gate_ring_from_prefill(_prefill_gates(), 4)}


def build_prefill_seed_fp32() -> dict[str, torch.Tensor]:
    return {"g_cache": seed_gate_ring_from_prefill_fp32(_prefill_gates(), 4)}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def init_model_for_generation(dtype: torch.dtype, batch_size: int) -> tuple[MixerModel, dict[int, torch.Tensor]]:
    """Builds the model directly in `dtype` (no fp32 copy of the weights) plus its gate rings."""
    with default_dtype(dtype):
        model = MixerModel()
        g_caches = {
            i: torch.zeros(batch_size, layer.nheads, layer.ring_len, layer.headdim)  # expect-bug: default-dtype
            for i, layer in enumerate(model.layers)
            if isinstance(layer, KDAMixer)
        }
    return model, g_caches


def init_model_for_generation_fp32_gates(dtype: torch.dtype, batch_size: int) -> tuple[MixerModel, dict[int, torch.Tensor]]:
    with default_dtype(dtype):
        model = MixerModel()
    g_caches = {
        i: torch.zeros(batch_size, layer.nheads, layer.ring_len, layer.headdim)
        for i, layer in enumerate(model.layers)
        if isinstance(layer, KDAMixer)
    }
    return model, g_caches


def build_init_in_bf16() -> dict[str, object]:
    model, g_caches = init_model_for_generation(torch.bfloat16, 2)
    return {"weight": model.layers[0].in_proj.weight, "g_caches": g_caches}


def build_init_in_bf16_fp32_gates() -> dict[str, object]:
    model, g_caches = init_model_for_generation_fp32_gates(torch.bfloat16, 2)
    return {"weight": model.layers[0].in_proj.weight, "g_caches": g_caches}
