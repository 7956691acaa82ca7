"""Checks the executor runs before warm-up, and the buffers it keeps for graph replay."""

import torch

from .dtypes import KvCacheConfig, str_dtype_to_torch
from .resource_manager import ReplayStateManager, make_manager

EXPECTED_GATE_DTYPE = "float32"


def check(manager: ReplayStateManager) -> None:
    if manager.replayssm_g.dtype != str_dtype_to_torch(EXPECTED_GATE_DTYPE):
        raise RuntimeError(f"replayssm_g is {manager.replayssm_g.dtype}")


def graph_buffers(manager: ReplayStateManager) -> dict[str, torch.Tensor]:
    graph_replayssm_g = manager.replayssm_g.clone(memory_format=torch.contiguous_format)
    graph_slots = torch.zeros(3, dtype=torch.int32)
    return {"graph_replayssm_g": graph_replayssm_g, "graph_slots": graph_slots}


def build_graph_buffers() -> dict[str, torch.Tensor]:
    manager = make_manager(KvCacheConfig(), "bfloat16", fp32_gate=True)
    check(manager)
    return graph_buffers(manager)
