"""Executor-side checks on the cache manager's tensors before a CUDA graph is captured."""

import torch

from ._utils import str_dtype_to_torch
from .kv_cache_config import KvCacheConfig
from .mamba_cache_manager import MambaCacheManager, create_mamba_cache_manager_fp32_gates

GATE_DTYPE_NAME = "float32"


def validate_manager(manager: MambaCacheManager) -> None:
    expected = str_dtype_to_torch(GATE_DTYPE_NAME)
    assert manager.replay_g_cache.dtype == expected, manager.replay_g_cache.dtype


def snapshot_for_graph(manager: MambaCacheManager) -> dict[str, torch.Tensor]:
    static_g_cache = torch.empty_like(manager.replay_g_cache).copy_(manager.replay_g_cache)
    static_indices = manager.write_pos.to(torch.int64)
    return {"static_g_cache": static_g_cache, "static_indices": static_indices}


def build_graph_snapshot() -> dict[str, torch.Tensor]:
    manager = create_mamba_cache_manager_fp32_gates(KvCacheConfig(), torch.bfloat16)
    manager.reset()
    validate_manager(manager)
    return snapshot_for_graph(manager)
