# Copyright (c) OpenMMLab. All rights reserved.
import logging
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..config import CacheConfig, ModelConfig, SpecDecodeConfig, _get_dtype, get_kda_state_dtypes
from ..model_inputs import ReplayCache
from .cache_engine import decode_layers, run_dummy_decode

logger = logging.getLogger('lmdeploy')

_ALIGNMENT = 64


class RollbackRows(NamedTuple):
    """Ring rows saved before a draft is verified, restored for rejected tokens."""
    delta_cache: torch.Tensor
    key_cache: torch.Tensor
    gate_cache: torch.Tensor


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return numel


def _align(nbytes: int, alignment: int = _ALIGNMENT) -> int:
    return (nbytes + alignment - 1) // alignment * alignment


class StateCacheEngine:
    """Replay caches of the KDA layers in a single memory pool.

    Every (layer, slot) owns one aligned row of the pool; the checkpoint state and the three rings
    are typed views into it, so a slot can be reset, forked or offloaded with one copy.

    Args:
        cache_config (CacheConfig): the cache config.
        model_config (ModelConfig): the model config.
        spec_config (SpecDecodeConfig): speculative decoding config, if any.
        device (str): device of the pool.
    """

    def __init__(self,
                 cache_config: CacheConfig,
                 model_config: ModelConfig,
                 spec_config: Optional[SpecDecodeConfig] = None,
                 device: str = 'cuda'):
        self.cache_config = cache_config
        self.model_config = model_config
        self.spec_config = spec_config
        self.device = device
        self.num_layers = model_config.num_layers
        self.num_caches = cache_config.num_gpu_slots
        self.ring_len = cache_config.ring_len
        self.dtypes = get_kda_state_dtypes(model_config.dtype, cache_config.cache_dtype, cache_config.ssm_cache_dtype)
        self.mem_pool, self.state_caches = self.allocate_caches(self.num_caches, device)
        self.write_pos = torch.zeros(self.num_caches, dtype=torch.int32, device=device)
        self.prefix_snapshots: Optional[Dict[str, torch.Tensor]] = None
        if cache_config.enable_prefix_caching:
            self.prefix_snapshots = self.allocate_snapshot_pool(cache_config.num_prefix_snapshots)
        self.rollback_rows: Optional[List[RollbackRows]] = None

    def _cache_descs(self) -> List[Tuple[str, Tuple[int, ...], torch.dtype]]:
        """(field, per-slot shape, dtype) of the caches of one layer."""
        shapes = self.model_config.get_replay_cache_shapes(1, self.ring_len)
        return [
            ('state', shapes.state[1:], self.dtypes.state),
            ('delta_cache', shapes.delta[1:], self.dtypes.delta),
            ('key_cache', shapes.key[1:], self.dtypes.key),
            ('gate_cache', shapes.gate[1:], self.dtypes.gate),
        ]

    def get_cache_state_size(self) -> int:
        """Bytes of one (layer, slot) row of the pool."""
        return sum(_align(_numel(shape) * dtype.itemsize) for _, shape, dtype in self._cache_descs())

    def allocate_caches(self, num_caches: int, device: str) -> Tuple[torch.Tensor, List[ReplayCache]]:
        """Allocate the pool and the typed views of every layer."""
        descs = self._cache_descs()
        row_size = self.get_cache_state_size()
        mem_pool = torch.zeros(self.num_layers, num_caches, row_size, dtype=torch.uint8, device=device)
        caches = []
        for layer_id in range(self.num_layers):
            views = dict()
            offset = 0
            for name, shape, dtype in descs:
                nbytes = _numel(shape) * dtype.itemsize
                view = mem_pool[layer_id, :, offset:offset + nbytes].view(dtype)
                views[name] = view.view(num_caches, *shape)
                offset += _align(nbytes)
            caches.append(ReplayCache(**views))
        logger.debug(f'Allocate state cache pool of {mem_pool.numel()} bytes.')
        return mem_pool, caches

    def reset_slots(self, slots: Sequence[int]):
        """Clear the caches of finished sequences."""
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=self.device)
        self.mem_pool.index_fill_(1, idx, 0)
        self.write_pos.index_fill_(0, idx, 0)

    def fork_slot(self, src: int, dst: int):
        """Copy a slot to another one (parallel sampling of one prompt)."""
        self.mem_pool[:, dst].copy_(self.mem_pool[:, src])
        self.write_pos[dst] = self.write_pos[src]

    def allocate_snapshot_pool(self, num_snapshots: int) -> Dict[str, torch.Tensor]:
        """Snapshots of finished prefixes, taken right after a forced flush."""
        shapes = self.model_config.get_replay_cache_shapes(num_snapshots, self.ring_len)
        pool = dict()
        for name, shape in zip(('state', 'delta', 'key', 'log_decay'), shapes):
            pool[name] = torch.zeros(self.num_layers, *shape, dtype=self.dtypes.state, device=self.device)  # expect-bug: pool-dtype
        pool['write_pos'] = torch.zeros(num_snapshots, dtype=torch.int32, device=self.device)
        return pool

    def take_snapshot(self, slot: int, snapshot_id: int):
        for layer_id, cache in enumerate(self.state_caches):
            for name, tensor in zip(('state', 'delta', 'key', 'log_decay'), cache):
                self.prefix_snapshots[name][layer_id, snapshot_id].copy_(tensor[slot])
        self.prefix_snapshots['write_pos'][snapshot_id] = self.write_pos[slot]

    def restore_snapshot(self, snapshot_id: int, slot: int):
        for layer_id, cache in enumerate(self.state_caches):
            for name, tensor in zip(('state', 'delta', 'key', 'log_decay'), cache):
                tensor[slot].copy_(self.prefix_snapshots[name][layer_id, snapshot_id])
        self.write_pos[slot] = self.prefix_snapshots['write_pos'][snapshot_id]

    def allocate_rollback_rows(self, num_tokens: Optional[int] = None) -> List[RollbackRows]:
        """Rows of every slot that the verification of ``num_tokens`` draft tokens may overwrite."""
        if num_tokens is None:
            num_tokens = self.spec_config.num_speculative_tokens
        scratch_dtype = _get_dtype(self.spec_config.scratch_dtype, self.dtypes.delta)
        shapes = self.model_config.get_replay_cache_shapes(self.num_caches, num_tokens)
        rows = []
        for _ in range(self.num_layers):
            delta_cache = torch.zeros(shapes.delta, dtype=scratch_dtype, device=self.device)
            key_cache = torch.zeros(shapes.key, dtype=scratch_dtype, device=self.device)
            gate_cache = torch.zeros(shapes.gate, dtype=scratch_dtype, device=self.device)  # expect-bug: imported-policy
            rows.append(RollbackRows(delta_cache, key_cache, gate_cache))
        self.rollback_rows = rows
        return rows

    def save_rollback_rows(self, slot: int, start: int, num_rows: int):
        end = min(start + num_rows, self.ring_len)
        for cache, rows in zip(self.state_caches, self.rollback_rows):
            for src, dst in zip(cache[1:], rows):
                dst[slot, :, :end - start].copy_(src[slot, :, start:end])

    def rollback(self, slot: int, start: int, num_rows: int):
        """Restore the ring rows of ``slot`` written by rejected draft tokens."""
        end = min(start + num_rows, self.ring_len)
        for cache, rows in zip(self.state_caches, self.rollback_rows):
            for dst, src in zip(cache[1:], rows):
                dst[slot, :, start:end].copy_(src[slot, :, :end - start])
        self.write_pos[slot] = start

    def offload_slot(self, slot: int) -> List[ReplayCache]:
        """Copy one slot to host memory (preemption without recompute)."""
        pin_memory = torch.cuda.is_available() and str(self.device).startswith('cuda')
        host_caches = []
        for cache in self.state_caches:
            state = torch.empty_like(cache.state[slot], device='cpu', pin_memory=pin_memory)
            delta_cache = torch.empty_like(cache.delta_cache[slot], device='cpu', pin_memory=pin_memory)
            key_cache = torch.empty_like(cache.key_cache[slot], device='cpu', pin_memory=pin_memory)
            gate_cache = torch.empty_like(cache.delta_cache[slot], device='cpu', pin_memory=pin_memory)  # expect-bug: like
            for dst, src in zip((state, delta_cache, key_cache, gate_cache), cache):
                dst.copy_(src[slot])
            host_caches.append(ReplayCache(state, delta_cache, key_cache, gate_cache))
        return host_caches

    def decode(self, inputs: Dict[str, torch.Tensor], slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None):
        """Run one decode step of every layer (profiling, warmup)."""
        return decode_layers(self.state_caches, self.write_pos, self.model_config, inputs, slots, force_flush)


def build_state_cache_engine():
    """Decode on the pool with GQA heads, fork a slot, reset another one and decode again."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=3, ring_len=4)
    engine = StateCacheEngine(cache_config, _tiny_config(), device='cpu')
    run_dummy_decode(engine, [0, 1], 3)
    engine.fork_slot(0, 2)
    engine.reset_slots([1])
    outs = run_dummy_decode(engine, [2, 1, 0], 2, seed=1)
    return {'state_caches': engine.state_caches, 'write_pos': engine.write_pos, 'outs': outs}


def build_prefix_snapshot_states():
    """Flush a finished prefix, snapshot it and start a new sequence from the snapshot."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=3, ring_len=4, enable_prefix_caching=True, num_prefix_snapshots=2)
    engine = StateCacheEngine(cache_config, _tiny_config(num_value_heads=2, lower_bound=-5.0), device='cpu')
    run_dummy_decode(engine, [0], 3, flush_step=1)
    engine.take_snapshot(0, 1)
    engine.restore_snapshot(1, 2)
    outs = run_dummy_decode(engine, [2, 0], 2, seed=1)
    return {'snapshots': engine.prefix_snapshots, 'state_caches': engine.state_caches, 'outs': outs}


def build_preempted_spec_states():
    """Verify a two token draft with rollback rows, reject it, then preempt the slot to host."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=2, ring_len=8)
    spec_config = SpecDecodeConfig(num_speculative_tokens=2)
    engine = StateCacheEngine(cache_config, _tiny_config(num_value_heads=2), spec_config=spec_config, device='cpu')
    run_dummy_decode(engine, [0, 1], 2)
    engine.allocate_rollback_rows()
    start = int(engine.write_pos[1])
    engine.save_rollback_rows(1, start, 2)
    run_dummy_decode(engine, [1], 2, seed=1)
    engine.rollback(1, start, 2)
    host_caches = engine.offload_slot(1)
    return {'rollback_rows': engine.rollback_rows, 'host_caches': host_caches, 'state_caches': engine.state_caches}
