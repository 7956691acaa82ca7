# Copyright (c) OpenMMLab. All rights reserved.
import logging
import os.path as osp
import tempfile
from typing import Any, Dict, List, Optional

import torch

from ..config import CacheConfig, ModelConfig, ReplayCacheShapes, _get_dtype, get_kda_state_dtypes
from ..kernels.replay_decode import make_dummy_decode_inputs, next_write_pos, replay_decode_step
from ..model_inputs import ReplayCache

logger = logging.getLogger('lmdeploy')

SwapMap = Dict[int, int]


class CacheEngine:
    """Host and device replay caches of the KDA layers, one slot per sequence.

    Args:
        cache_config (CacheConfig): the cache config.
        model_config (ModelConfig): the model config.
        device (str): device of the device caches.
    """

    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig, device: str = 'cuda'):
        self.cache_config = cache_config
        self.model_config = model_config
        self.device = device
        self.num_layers = model_config.num_layers
        self.ring_len = cache_config.ring_len
        self.dtypes = get_kda_state_dtypes(model_config.dtype, cache_config.cache_dtype, cache_config.ssm_cache_dtype)
        self.cache_dtype = self.dtypes.delta
        self.migration_dtype = _get_dtype(cache_config.migration_dtype, self.cache_dtype)

        self.local_gpu_cache = self.allocate_gpu_cache()
        self.local_cpu_cache = self.allocate_cpu_cache() if cache_config.num_cpu_slots > 0 else []
        self.write_pos = torch.zeros(cache_config.num_gpu_slots, dtype=torch.int32, device=device)
        logger.debug(f'Initialize replay caches: {self.num_layers} layers, {cache_config.num_gpu_slots} gpu slots, '
                     f'{cache_config.num_cpu_slots} cpu slots.')

    @property
    def gpu_cache(self) -> List[ReplayCache]:
        return self.local_gpu_cache

    @property
    def cpu_cache(self) -> List[ReplayCache]:
        return self.local_cpu_cache

    def get_cache_shapes(self, num_slots: int) -> ReplayCacheShapes:
        return self.model_config.get_replay_cache_shapes(num_slots, self.ring_len)

    def _allocate_cache(self, num_slots: int, device: str) -> ReplayCache:
        """Allocate the caches of one layer."""
        shapes = self.get_cache_shapes(num_slots)
        state = torch.zeros(shapes.state, dtype=self.dtypes.state, device=device)
        delta_cache = torch.zeros(shapes.delta, dtype=self.dtypes.delta, device=device)
        key_cache = torch.zeros(shapes.key, dtype=self.dtypes.key, device=device)
        gate_cache = torch.zeros(shapes.gate, dtype=self.dtypes.gate, device=device)  # expect-bug: imported-policy id=ssm-dtype
        return ReplayCache(state, delta_cache, key_cache, gate_cache)

    def allocate_gpu_cache(self) -> List[ReplayCache]:
        """Allocate the device caches of every layer."""
        return [self._allocate_cache(self.cache_config.num_gpu_slots, self.device) for _ in range(self.num_layers)]

    def allocate_cpu_cache(self) -> List[ReplayCache]:
        """Allocate the host caches of every layer (pinned when the device is a gpu)."""
        num_slots = self.cache_config.num_cpu_slots
        shapes = self.get_cache_shapes(num_slots)
        pin_memory = torch.cuda.is_available() and str(self.device).startswith('cuda')
        cpu_cache = []
        for _ in range(self.num_layers):
            state = torch.zeros(shapes.state, dtype=self.dtypes.state, pin_memory=pin_memory)
            delta_cache = torch.zeros(shapes.delta, dtype=self.cache_dtype, pin_memory=pin_memory)
            key_cache = torch.zeros(shapes.key, dtype=self.cache_dtype, pin_memory=pin_memory)
            gate_cache = torch.zeros(shapes.gate, dtype=self.cache_dtype, pin_memory=pin_memory)  # expect-bug: pool-dtype
            cpu_cache.append(ReplayCache(state, delta_cache, key_cache, gate_cache))
        return cpu_cache

    @staticmethod
    def _swap(src: List[ReplayCache], dst: List[ReplayCache], src_to_dst: SwapMap):
        """Copy slots between caches; ``copy_`` converts to the dtype of ``dst``."""
        for src_cache, dst_cache in zip(src, dst):
            for src_tensor, dst_tensor in zip(src_cache, dst_cache):
                for src_slot, dst_slot in src_to_dst.items():
                    dst_tensor[dst_slot].copy_(src_tensor[src_slot], non_blocking=True)

    def swap_in(self, src_to_dst: SwapMap):
        """Move slots from host to device."""
        self._swap(self.local_cpu_cache, self.local_gpu_cache, src_to_dst)

    def swap_out(self, src_to_dst: SwapMap):
        """Move slots from device to host."""
        self._swap(self.local_gpu_cache, self.local_cpu_cache, src_to_dst)

    def export_slot(self, slot: int) -> Dict[str, torch.Tensor]:
        """Pack one device slot for migration to a decode instance (prefill/decode disaggregation)."""
        payload = dict(write_pos=self.write_pos[slot].clone())
        for layer_id, cache in enumerate(self.local_gpu_cache):
            payload[f'{layer_id}.state'] = cache.state[slot].to(self.migration_dtype)
            payload[f'{layer_id}.delta_cache'] = cache.delta_cache[slot].to(self.migration_dtype)
            payload[f'{layer_id}.key_cache'] = cache.key_cache[slot].to(self.migration_dtype)
            payload[f'{layer_id}.gate_cache'] = cache.gate_cache[slot].to(self.migration_dtype)  # expect-bug: cast
        return payload

    def import_slot(self, payload: Dict[str, torch.Tensor], slot: int):
        """Unpack a migrated slot into device slot ``slot``."""
        for layer_id, cache in enumerate(self.local_gpu_cache):
            for name, tensor in zip(ReplayCache._fields, cache):
                tensor[slot].copy_(payload[f'{layer_id}.{name}'])
        self.write_pos[slot] = payload['write_pos']

    def save_cpu_cache(self, path: str):
        """Save the host caches, e.g. before the instance is restarted."""
        state_dict = dict()
        for layer_id, cache in enumerate(self.local_cpu_cache):
            for name, tensor in zip(ReplayCache._fields, cache):
                state_dict[f'layers.{layer_id}.{name}'] = tensor
        torch.save(state_dict, path)

    def restore_cpu_cache(self, path: str):
        """Replace the host caches with the ones saved by :meth:`save_cpu_cache`."""
        snapshot = torch.load(path, map_location='cpu', weights_only=True)
        cpu_cache = []
        for layer_id in range(self.num_layers):
            prefix = f'layers.{layer_id}'
            state = snapshot[f'{prefix}.state'].to(self.dtypes.state)
            delta_cache = snapshot[f'{prefix}.delta_cache'].to(self.cache_dtype)
            key_cache = snapshot[f'{prefix}.key_cache'].to(self.cache_dtype)
            gate_cache = snapshot[f'{prefix}.gate_cache'].to(self.cache_dtype)  # expect-bug: load
            cpu_cache.append(ReplayCache(state, delta_cache, key_cache, gate_cache))
        self.local_cpu_cache = cpu_cache

    @staticmethod
    def get_cache_slot_size(cache_config: CacheConfig, model_config: ModelConfig) -> int:
        """Bytes of the caches of one slot over every layer."""
        shapes = model_config.get_replay_cache_shapes(1, cache_config.ring_len)
        dtypes = get_kda_state_dtypes(model_config.dtype, cache_config.cache_dtype, cache_config.ssm_cache_dtype)
        slot_size = 0
        for shape, dtype in zip(shapes, dtypes):
            numel = 1
            for dim in shape:
                numel *= dim
            slot_size += numel * dtype.itemsize
        return slot_size * model_config.num_layers

    def decode(self, inputs: Dict[str, torch.Tensor], slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None):
        """Run one decode step of every layer on the device caches (profiling, warmup)."""
        return decode_layers(self.local_gpu_cache, self.write_pos, self.model_config, inputs, slots, force_flush)


def decode_layers(caches: List[ReplayCache],
                  cursors: torch.Tensor,
                  model_config: ModelConfig,
                  inputs: Dict[str, torch.Tensor],
                  slots: torch.Tensor,
                  force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One decode step of every layer with the same activations; advances the ``cursors`` of ``slots``."""
    ring_len = caches[0].delta_cache.size(2)
    write_pos = cursors[slots.clamp(min=0).long()]
    outs = []
    for cache in caches:
        out = inputs['mixed_qkv'].new_empty(slots.size(0), 1, model_config.num_value_heads, model_config.v_head_dim)
        replay_decode_step(**inputs, scale=model_config.head_dim**-0.5, initial_state=cache.state,
                           d_cache=cache.delta_cache, k_cache=cache.key_cache, g_cache=cache.gate_cache, out=out,
                           ssm_state_indices=slots, write_pos=write_pos, force_flush=force_flush,
                           lower_bound=model_config.lower_bound)
        outs.append(out)
    valid = slots >= 0
    cursors[slots[valid].long()] = next_write_pos(write_pos, ring_len, force_flush)[valid]
    return torch.stack(outs)


def run_dummy_decode(engine: Any, slots: List[int], steps: int, flush_step: int = -1, seed: int = 0):
    """Decode ``steps`` steps of random activations on the caches of ``engine``."""
    generator = torch.Generator().manual_seed(seed)
    config = engine.model_config
    slots = torch.tensor(slots, dtype=torch.int32)
    outs = []
    for step in range(steps):
        inputs = make_dummy_decode_inputs(slots.size(0), config.num_attention_heads, config.num_value_heads,
                                          config.head_dim, config.v_head_dim, dtype=config.dtype,
                                          generator=generator)
        force_flush = torch.full_like(slots, int(step == flush_step))
        outs.append(engine.decode(inputs, slots, force_flush))
    return torch.stack(outs)


def build_cache_engine():
    """A bf16 engine with float32 checkpoints decoding five steps."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=3, ring_len=4, ssm_cache_dtype='float32')
    engine = CacheEngine(cache_config, _tiny_config(), device='cpu')
    outs = run_dummy_decode(engine, [0, 2, -1], 5, flush_step=2)
    return {'gpu_cache': engine.gpu_cache, 'write_pos': engine.write_pos, 'outs': outs,
            'slot_bytes': torch.tensor(CacheEngine.get_cache_slot_size(cache_config, engine.model_config))}


def build_swapped_cache_engine():
    """Decode, swap two slots out, save the host caches and restore them in a new engine."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=2, num_cpu_slots=2, ring_len=4)
    engine = CacheEngine(cache_config, _tiny_config(), device='cpu')
    run_dummy_decode(engine, [0, 1], 3)
    engine.swap_out({0: 1, 1: 0})
    restarted = CacheEngine(cache_config, _tiny_config(), device='cpu')
    with tempfile.TemporaryDirectory() as tmp_dir:
        path = osp.join(tmp_dir, 'cpu_cache.pt')
        engine.save_cpu_cache(path)
        restarted.restore_cpu_cache(path)
    restarted.swap_in({0: 0, 1: 1})
    outs = run_dummy_decode(restarted, [1, 0], 2, seed=1)
    return {'cpu_cache': engine.cpu_cache, 'restored_cpu_cache': restarted.cpu_cache,
            'gpu_cache': restarted.gpu_cache, 'outs': outs}


def build_migrated_cache_engine():
    """Prefill instance with bf16 checkpoints migrating a slot to a decode instance."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    cache_config = CacheConfig(max_batches=2, ring_len=4, ssm_cache_dtype='bfloat16')
    prefill_engine = CacheEngine(cache_config, _tiny_config(), device='cpu')
    run_dummy_decode(prefill_engine, [1, 0], 2)
    payload = prefill_engine.export_slot(1)
    decode_engine = CacheEngine(cache_config, _tiny_config(), device='cpu')
    decode_engine.import_slot(payload, 0)
    outs = run_dummy_decode(decode_engine, [0], 3, seed=2)
    return {'payload': payload, 'gpu_cache': decode_engine.gpu_cache, 'outs': outs}
