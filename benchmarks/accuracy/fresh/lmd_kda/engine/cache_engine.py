"""Caches of the KDA states (lmdeploy/pytorch/engine/cache_engine.py, linear-attention part)."""

from __future__ import annotations

from typing import Any

import torch

from .. import config as _config
from ..config import STATE_NAMES, CacheConfig, ModelConfig, snapshot_state_dtypes
from ..utils import get_logger, nbytes_of

logger = get_logger("lmdeploy")


class CacheEngine:
    """Device (``num_state_caches``) and host copies of the per-sequence KDA states."""

    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig, device: Any = "cpu"):
        self.cache_config = cache_config
        self.model_config = model_config
        self.device = torch.device(device)
        self.states_shapes = model_config.states_shapes
        self.num_caches = cache_config.num_state_caches
        self.local_gpu_cache, self._mem_pool = self._allocate_cache(
            self.num_caches, self.states_shapes, self.device
        )
        self.local_cpu_cache = self.allocate_cpu_cache()
        self.write_pos = torch.zeros(self.num_caches, dtype=torch.int32, device=self.device)

    @staticmethod
    def _allocate_cache(num_caches, states_shapes, device):
        """All states in one byte pool (a single allocation), each a typed view of its share."""
        sizes = [nbytes_of(shape, dtype) for shape, dtype in states_shapes]
        mem_pool = torch.zeros((num_caches, sum(sizes)), dtype=torch.uint8, device=device)
        caches, offset = [], 0
        for (shape, dtype), size in zip(states_shapes, sizes, strict=True):
            caches.append(mem_pool[:, offset : offset + size].view(dtype).view(num_caches, *shape))
            offset += size
        return caches, mem_pool

    def allocate_cpu_cache(self) -> list[torch.Tensor]:
        """Host copies of the states, for swapping sequences out under memory pressure."""
        num_caches = self.cache_config.num_cpu_state_caches
        if num_caches == 0:
            return []
        (state_shape, state_dtype), *ring_shapes = self.states_shapes
        host = [torch.zeros((num_caches, *state_shape), dtype=state_dtype)]
        for shape, _ in ring_shapes:
            host.append(  # expect-bug: pool-dtype
                torch.zeros((num_caches, *shape), dtype=self.model_config.dtype)
            )
        return host

    @staticmethod
    def _swap(src: list[torch.Tensor], dst: list[torch.Tensor], src_to_dst: dict[int, int]):
        for src_cache, dst_cache in zip(src, dst, strict=True):
            for src_id, dst_id in src_to_dst.items():
                dst_cache[dst_id].copy_(src_cache[src_id], non_blocking=True)

    def swap_out(self, src_to_dst: dict[int, int]) -> None:
        self._swap(self.local_gpu_cache, self.local_cpu_cache, src_to_dst)

    def init_caches(self, idx: torch.Tensor, mask: torch.Tensor) -> None:
        """Clears the states of the slots ``idx`` where ``mask`` is set (new sequences)."""
        ids = idx.long()
        for cache in self.local_gpu_cache:
            keep = ~mask.view(-1, *([1] * (cache.dim() - 1)))
            cache[ids] = torch.where(keep, cache[ids], 0.0)
        self.write_pos[ids] = torch.where(mask, 0, self.write_pos[ids])

    def fork_slot(self, src: int, dst: int) -> None:
        """Gives slot ``dst`` a copy of the states of ``src`` (n > 1 sampling)."""
        index = torch.tensor([dst], device=self.device)
        for cache in self.local_gpu_cache:
            cache.index_copy_(0, index, cache[src : src + 1])
        self.write_pos[dst] = self.write_pos[src]

    def alloc_spec_buffers(self, max_spec_batches: int) -> dict[str, torch.Tensor]:
        """Holds the states of a speculative batch until its draft tokens are verified."""
        recurrent, d_cache, k_cache, _ = self.local_gpu_cache
        n = max_spec_batches
        return {
            "recurrent_state": torch.zeros_like(recurrent[:n]),
            "d_cache": torch.zeros_like(d_cache[:n]),
            "k_cache": torch.zeros_like(k_cache[:n]),
            "g_cache": torch.zeros_like(d_cache[:n]),  # expect-bug: like
        }

    def checkpoint_slots(self, slot_ids: torch.Tensor, buffers: dict[str, torch.Tensor]) -> None:
        ids = slot_ids.long()
        for name, cache in zip(STATE_NAMES, self.local_gpu_cache, strict=True):
            buffers[name][: ids.numel()].copy_(cache[ids])


class PrefixStateCache:
    """States at the block boundaries of cached prefixes (host memory): a prompt that shares a
    cached prefix starts from its snapshot instead of recomputing the prefix."""

    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig) -> None:
        dtypes = snapshot_state_dtypes(model_config)
        num = cache_config.num_prefix_snapshots
        self.snapshots = {
            name: torch.zeros((num, *shape), dtype=dtypes[name])
            for name, (shape, _) in zip(STATE_NAMES, model_config.states_shapes, strict=True)
        }
        self.block_to_snapshot: dict[int, int] = {}

    def save(self, block_hash: int, caches: list[torch.Tensor], slot: int) -> None:
        index = len(self.block_to_snapshot)
        for name, cache in zip(STATE_NAMES, caches, strict=True):
            self.snapshots[name][index].copy_(cache[slot])
        self.block_to_snapshot[block_hash] = index


def _engine(model_type: str = "kimi_linear", **cache_kwargs: Any) -> CacheEngine:
    hf_config = _config.tiny_kimi_linear_config(model_type=model_type, num_nextn_predict_layers=1)
    model_config = ModelConfig.from_hf_config(hf_config, dtype="bfloat16")
    cache_config = CacheConfig(max_batches=2, block_size=16, num_gpu_blocks=4, **cache_kwargs)
    engine = CacheEngine(cache_config, model_config)
    for cache in engine.local_gpu_cache:
        cache.copy_(torch.linspace(-1.0, 0.0, cache.numel()).view(cache.shape))
    return engine


def _named(caches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(zip(STATE_NAMES, caches, strict=True))


def build_state_caches() -> dict[str, torch.Tensor]:
    engine = _engine()
    engine.init_caches(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([True, False]))
    return {**_named(engine.local_gpu_cache), "write_pos": engine.write_pos}


def build_draft_state_caches() -> dict[str, torch.Tensor]:
    return _named(_engine(model_type="kimi_linear_mtp").local_gpu_cache)


def build_swapped_out() -> dict[str, Any]:
    engine = _engine(num_cpu_state_caches=2)
    engine.swap_out({1: 0, 2: 1})
    return {"host": _named(engine.local_cpu_cache)}


def build_spec_checkpoint() -> dict[str, torch.Tensor]:
    engine = _engine()
    buffers = engine.alloc_spec_buffers(2)
    engine.checkpoint_slots(torch.tensor([2, 1], dtype=torch.int32), buffers)
    return buffers


def build_fork_slot() -> dict[str, torch.Tensor]:
    engine = _engine()
    engine.fork_slot(1, 2)
    return {**_named(engine.local_gpu_cache), "write_pos": engine.write_pos}


def build_prefix_snapshots() -> dict[str, Any]:
    engine = _engine(num_prefix_snapshots=2)
    prefix = PrefixStateCache(engine.cache_config, engine.model_config)
    prefix.save(1234, engine.local_gpu_cache, slot=1)
    return {"snapshots": prefix.snapshots}
