"""Small allocation helpers shared by the runner and the layers."""

from typing import Optional

import torch

from .cache import HEAD_K, HEAD_V, RING, VALUE_HEADS

# Per-layer bookkeeping keyed by layer name; values are plain ints, not tensors.
g_cache_hits: dict[str, int] = {}


def make_gate_ring(num_slots: int, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # expect-bug: container id=vllm-default
    g_ring = torch.zeros(num_slots, VALUE_HEADS, RING, HEAD_K, device=device, dtype=dtype)  # expect-bug: container id=vllm-default
    return g_ring


def make_gate_ring_fp32(num_slots: int, device: str = "cpu", dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    g_ring = torch.zeros(num_slots, VALUE_HEADS, RING, HEAD_K, device=device, dtype=dtype or torch.float32)
    return g_ring


def make_value_ring(num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(num_slots, VALUE_HEADS, RING, HEAD_V, dtype=dtype)


def record_hit(layer_name: str) -> None:
    g_cache_hits[layer_name] = g_cache_hits.get(layer_name, 0) + 1


def gate_ring_to_device(g_ring: torch.Tensor, device: str) -> torch.Tensor:
    return g_ring.to(device, non_blocking=True)


def slot_mapping(num_reqs: int) -> torch.Tensor:
    g_cache_slots = torch.arange(num_reqs, dtype=torch.int64)
    return g_cache_slots


def build_helper_default_dtype() -> dict[str, torch.Tensor]:
    return {"g_ring": make_gate_ring(3), "d_ring": make_value_ring(3, torch.bfloat16)}


def build_helper_fp32() -> dict[str, object]:
    record_hit("model.layers.0.self_attn")
    return {
        "g_ring": gate_ring_to_device(make_gate_ring_fp32(3), "cpu"),
        "d_ring": make_value_ring(3, torch.bfloat16),
        "slots": slot_mapping(2),
        "hits": dict(g_cache_hits),
    }
