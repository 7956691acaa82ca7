"""``DSStateManager``: which sequences are tracked, which cache slot each one holds, and the
host swap pool for sequences preempted under slot pressure."""

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..accelerator import get_accelerator
from ..config_v2 import DSStateManagerConfig, SSMCacheConfig
from .ragged_wrapper import BlockedAllocator, DSSequenceDescriptor
from .ssm_cache import BlockedSSMCache, SlotAccessMixin, _decode_random, _demo_configs


class HostSwapPool:
    """Pinned host copies of swapped-out slots: ``num_entries`` entries per layer."""

    def __init__(self, configs: Sequence[SSMCacheConfig], num_entries: int, dtype: torch.dtype) -> None:
        self.num_entries = num_entries
        self.dtype = dtype
        self._allocator = BlockedAllocator(num_entries)
        accel = get_accelerator()
        self.layers: List[Dict[str, Tensor]] = []
        for config in configs:
            entry = {"state": accel.pin_memory(torch.zeros((num_entries, *config.state_shape), dtype=torch.float32))}
            ring_shapes = {"delta_ring": config.delta_shape, "key_ring": config.key_shape, "decay_ring": config.decay_shape}
            for name, shape in ring_shapes.items():
                entry[name] = accel.pin_memory(torch.zeros((num_entries, *shape), dtype=dtype))  # expect-bug: pool-dtype
            entry["write_pos"] = torch.zeros(num_entries, dtype=torch.int32)
            self.layers.append(entry)

    def store(self, cache: SlotAccessMixin, slot: int) -> int:
        index = int(self._allocator.allocate(1)[0])
        for layer_idx, entry in enumerate(self.layers):
            for name, tensor in cache.slot_tensors(layer_idx, slot).items():
                entry[name][index].copy_(tensor, non_blocking=True)
        get_accelerator().synchronize()
        return index

    def load(self, cache: SlotAccessMixin, index: int, slot: int) -> None:
        for layer_idx, entry in enumerate(self.layers):
            cache.load_slot(layer_idx, slot, {name: tensor[index] for name, tensor in entry.items()})
        self._allocator.free([index])


class DSStateManager:
    def __init__(
        self,
        config: DSStateManagerConfig,
        ssm_configs: Tuple[SSMCacheConfig, ...],
        ssm_cache: Optional[SlotAccessMixin] = None,
    ) -> None:
        self._config = config
        self._ssm_configs = tuple(ssm_configs)
        num_slots = ssm_configs[0].num_slots if ssm_cache is None else ssm_cache.num_slots
        self._slot_allocator = BlockedAllocator(num_slots)
        self._ssm_cache = ssm_cache if ssm_cache is not None else BlockedSSMCache(self._ssm_configs)
        self._seqs: Dict[int, DSSequenceDescriptor] = {}
        self._swap: Optional[HostSwapPool] = None
        if config.swap_slots:
            swap_dtype = config.offload_dtype.value if config.offload_dtype is not None else ssm_configs[0].cache_dtype.value
            self._swap = HostSwapPool(self._ssm_configs, config.swap_slots, swap_dtype)

    @property
    def ssm_cache(self) -> SlotAccessMixin:
        return self._ssm_cache

    @property
    def ssm_configs(self) -> Tuple[SSMCacheConfig, ...]:
        return self._ssm_configs

    @property
    def swap_pool(self) -> Optional[HostSwapPool]:
        return self._swap

    @property
    def tracked_sequences(self) -> Dict[int, DSSequenceDescriptor]:
        return self._seqs

    def get_sequence(self, uid: int) -> Optional[DSSequenceDescriptor]:
        return self._seqs.get(uid)

    def get_or_create_sequence(self, uid: int) -> DSSequenceDescriptor:
        seq = self._seqs.get(uid)
        if seq is not None:
            return seq
        if len(self._seqs) >= self._config.max_tracked_sequences:
            raise RuntimeError(f"cannot track sequence {uid}: {len(self._seqs)} sequences tracked")
        slot = int(self._slot_allocator.allocate(1)[0])
        self._ssm_cache.reset_slots([slot])
        seq = self._seqs[uid] = DSSequenceDescriptor(uid, slot)
        return seq

    def flush_sequence(self, uid: int) -> None:
        seq = self._seqs.pop(uid, None)
        if seq is None:
            return
        if seq.slot is not None:
            self._slot_allocator.free([seq.slot])

    def swap_out(self, uid: int) -> None:
        if self._swap is None:
            raise RuntimeError("swapping is disabled (state_manager.swap_slots=0)")
        seq = self._seqs[uid]
        seq.swap_entry = self._swap.store(self._ssm_cache, seq.slot)
        self._slot_allocator.free([seq.slot])
        seq.slot = None

    def swap_in(self, uid: int) -> None:
        seq = self._seqs[uid]
        slot = int(self._slot_allocator.allocate(1)[0])
        self._swap.load(self._ssm_cache, seq.swap_entry, slot)
        seq.slot, seq.swap_entry = slot, None


def build_state_manager() -> Dict[str, object]:
    """Three sequences tracked on three slots; one finishes and its slot goes to a fourth."""
    torch.manual_seed(0)
    configs = tuple(_demo_configs(torch.bfloat16))
    manager = DSStateManager(DSStateManagerConfig(max_tracked_sequences=3, max_ragged_sequence_count=3), configs)
    seqs = [manager.get_or_create_sequence(uid) for uid in (10, 11, 12)]
    _decode_random(manager.ssm_cache, [s.slot for s in seqs], 3, torch.bfloat16)
    manager.flush_sequence(11)
    late = manager.get_or_create_sequence(13)
    _decode_random(manager.ssm_cache, [seqs[0].slot, late.slot, seqs[2].slot], 2, torch.bfloat16)
    cache = manager.ssm_cache
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "slots": torch.tensor([late.slot])}


def build_swap_out() -> Dict[str, object]:
    """Slot pressure on two slots: one sequence is swapped to host, another runs, it comes back."""
    torch.manual_seed(0)
    configs = tuple(_demo_configs(torch.bfloat16, num_slots=2))
    config = DSStateManagerConfig(max_tracked_sequences=3, max_ragged_sequence_count=2, swap_slots=1)
    manager = DSStateManager(config, configs)
    a, b = manager.get_or_create_sequence(1), manager.get_or_create_sequence(2)
    _decode_random(manager.ssm_cache, [a.slot, b.slot], 2, torch.bfloat16)
    manager.swap_out(1)
    c = manager.get_or_create_sequence(3)
    _decode_random(manager.ssm_cache, [b.slot, c.slot], 1, torch.bfloat16)
    manager.flush_sequence(3)
    manager.swap_in(1)
    cache = manager.ssm_cache
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "host": manager.swap_pool.layers}
