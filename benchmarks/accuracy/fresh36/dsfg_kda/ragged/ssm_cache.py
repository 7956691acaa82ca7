"""Blocked storage of the ReplaySSM caches: per layer, a checkpoint state and three rings for
each of ``num_slots`` sequences, plus each slot's int32 write position.

``BlockedSSMCache`` is the ``BlockedKVCache`` of the KDA layers. It is created by the state
manager from the model's ``ssm_cache_config()``; slots are handed out by the state manager's
allocator and indexed by the kernels through the ragged batch's slot ids.
"""

import math
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ..accelerator import get_accelerator
from ..config_v2 import AllocationMode, DtypeEnum, SSMCacheConfig
from ..kernels import fused_recurrent_kda_replayssm_decode, kda_gate

RING_NAMES = ("delta_ring", "key_ring", "decay_ring")


class LayerRings(NamedTuple):
    """One layer's ReplaySSM cache for all slots."""

    state: Tensor
    """``[S, HV, V, K]`` float32 checkpoints."""
    delta_ring: Tensor
    """``[S, HV, L, V]``."""
    key_ring: Tensor
    """``[S, H, L, K]``."""
    decay_ring: Tensor
    """``[S, HV, L, K]`` log-decays."""
    write_pos: Tensor
    """``[S]`` int32."""

    def kernel_args(self) -> Dict[str, Tensor]:
        """The keyword arguments of ``fused_recurrent_kda_replayssm_decode`` for these rings."""
        return {
            "initial_state": self.state,
            "d_cache": self.delta_ring,
            "k_cache": self.key_ring,
            "g_cache": self.decay_ring,
            "write_pos": self.write_pos,
        }


SLOT_TENSORS = LayerRings._fields


class SlotAccessMixin:
    """Slot-level operations of a cache that has ``num_layers``, ``layer(i)`` and ``update_layer``."""

    num_layers: int

    def layer(self, layer_idx: int) -> LayerRings:
        raise NotImplementedError

    def update_layer(self, layer_idx: int, **tensors: Tensor) -> None:
        raise NotImplementedError

    def layer_tensors(self, layer_idx: int) -> Dict[str, Tensor]:
        return dict(self.layer(layer_idx)._asdict())

    def slot_tensors(self, layer_idx: int, slot: int) -> Dict[str, Tensor]:
        """Views of one slot's checkpoint, rings and write position."""
        return {name: tensor[slot] for name, tensor in self.layer(layer_idx)._asdict().items()}

    def load_slot(self, layer_idx: int, slot: int, tensors: Mapping[str, Tensor]) -> None:
        rings = self.layer(layer_idx)
        for name, tensor in tensors.items():
            target = getattr(rings, name)[slot]
            if name in RING_NAMES and tensor.shape[1] < target.shape[1]:
                target.zero_()
                target = target[:, : tensor.shape[1]]
            target.copy_(tensor)

    def reset_slots(self, slots: Iterable[int]) -> None:
        index = torch.tensor(list(slots), dtype=torch.long)
        for layer_idx in range(self.num_layers):
            for tensor in self.layer(layer_idx):
                tensor.index_fill_(0, index.to(tensor.device), 0)

    def adopt_layer(self, layer_idx: int, tensors: Mapping[str, Tensor]) -> None:
        """Replaces a layer's storage with ``tensors`` (same shapes), e.g. after a restore."""
        current = self.layer(layer_idx)
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != tuple(getattr(current, name).shape):
                raise ValueError(f"layer {layer_idx} {name}: shape {tuple(tensor.shape)} != {tuple(getattr(current, name).shape)}")
        self.update_layer(layer_idx, **tensors)


class BlockedSSMCache(SlotAccessMixin):
    def __init__(self, configs: Sequence[SSMCacheConfig], device: Optional[str] = None) -> None:
        self._configs: List[SSMCacheConfig] = list(configs)
        self._device = device or get_accelerator().current_device_name()
        self._rings: List[LayerRings] = [self._allocate(config) for config in self._configs]

    def _allocate(self, config: SSMCacheConfig) -> LayerRings:
        if config.allocation_mode is AllocationMode.PACKED:
            return self._allocate_packed(config)
        n, device = config.num_slots, self._device
        return LayerRings(
            state=torch.zeros((n, *config.state_shape), dtype=config.state_dtype.value, device=device),
            delta_ring=torch.zeros((n, *config.delta_shape), dtype=config.cache_dtype.value, device=device),
            key_ring=torch.zeros((n, *config.key_shape), dtype=config.cache_dtype.value, device=device),
            decay_ring=torch.zeros((n, *config.decay_shape), dtype=config.decay_dtype.value, device=device),
            write_pos=torch.zeros(n, dtype=torch.int32, device=device),
        )

    def _allocate_packed(self, config: SSMCacheConfig) -> LayerRings:
        """The three rings of a layer carved out of one allocation (fewer, larger blocks for the
        accelerator's caching allocator)."""
        n, device = config.num_slots, self._device
        shapes = (config.delta_shape, config.key_shape, config.decay_shape)
        sizes = [n * math.prod(shape) for shape in shapes]
        flat = torch.zeros(sum(sizes), dtype=config.cache_dtype.value, device=device)  # expect-bug: pool-dtype
        delta, key, decay = (chunk.view(n, *shape) for chunk, shape in zip(flat.split(sizes), shapes))
        state = torch.zeros((n, *config.state_shape), dtype=config.state_dtype.value, device=device)
        return LayerRings(state, delta, key, decay, torch.zeros(n, dtype=torch.int32, device=device))

    @property
    def num_layers(self) -> int:
        return len(self._rings)

    @property
    def num_slots(self) -> int:
        return self._configs[0].num_slots

    def layer(self, layer_idx: int) -> LayerRings:
        return self._rings[layer_idx]

    def update_layer(self, layer_idx: int, **tensors: Tensor) -> None:
        self._rings[layer_idx] = self._rings[layer_idx]._replace(**tensors)

    def grow(self, extra_slots: int) -> None:
        """Adds ``extra_slots`` empty slots to every layer; existing slots keep their contents."""
        for i, (config, rings) in enumerate(zip(self._configs, self._rings)):
            old, n = config.num_slots, config.num_slots + extra_slots
            state = rings.state.new_zeros((n, *config.state_shape))
            delta = rings.delta_ring.new_zeros((n, *config.delta_shape))
            key = rings.key_ring.new_zeros((n, *config.key_shape))
            decay = rings.delta_ring.new_zeros((n, *config.decay_shape))  # expect-bug: like
            write_pos = rings.write_pos.new_zeros(n)
            grown = LayerRings(state, delta, key, decay, write_pos)
            for new, current in zip(grown, rings):
                new[:old].copy_(current)
            self._rings[i] = grown
            self._configs[i] = config.model_copy(update={"num_slots": n})

    def retype_(self, dtype: torch.dtype) -> None:
        """Switches the rings to ``dtype`` (an engine that changes its activation dtype, or a
        memory-pressure fallback to fp16); checkpoints and write positions keep theirs."""
        for i, rings in enumerate(self._rings):
            converted = {name: getattr(rings, name).to(dtype) for name in RING_NAMES}  # expect-bug: cast
            self._rings[i] = rings._replace(**converted)
            self._configs[i] = self._configs[i].model_copy(update={"cache_dtype": DtypeEnum(dtype)})



def _demo_configs(
    cache_dtype: torch.dtype, num_slots: int = 3, mode: AllocationMode = AllocationMode.PER_RING, num_layers: int = 2
) -> List[SSMCacheConfig]:
    h, hv, dk, dv, ring_len = 2, 4, 8, 8, 4
    return [
        SSMCacheConfig(
            num_slots=num_slots,
            state_shape=(hv, dv, dk),
            delta_shape=(hv, ring_len, dv),
            key_shape=(h, ring_len, dk),
            decay_shape=(hv, ring_len, dk),
            cache_dtype=cache_dtype,
            allocation_mode=mode,
        )
        for _ in range(num_layers)
    ]


def _decode_random(cache: BlockedSSMCache, slot_ids: Sequence[int], steps: int, dtype: torch.dtype) -> Tensor:
    """Runs ``steps`` launches of random q/k/v/gates on every layer of ``cache``."""
    slots = torch.tensor(list(slot_ids), dtype=torch.int32)
    rows = len(slot_ids)
    A_log = torch.linspace(-1.0, 0.5, 4)
    dt_bias = torch.linspace(-0.5, 0.5, 32)
    outs = []
    for _ in range(steps):
        for layer_idx in range(cache.num_layers):
            q = torch.randn(rows, 2, 8, dtype=dtype)
            k = torch.randn(rows, 2, 8, dtype=dtype)
            v = torch.randn(rows, 4, 8, dtype=dtype)
            g = kda_gate(torch.randn(rows, 32, dtype=dtype), A_log, dt_bias, 4)
            beta = torch.rand(rows, 4, dtype=dtype)
            outs.append(
                fused_recurrent_kda_replayssm_decode(q, k, v, g, beta, slot_ids=slots, **cache.layer(layer_idx).kernel_args())
            )
    return torch.stack(outs)


def build_blocked_cache() -> Dict[str, object]:
    """A per-ring bf16 cache: five launches on two slots (one folds), a slot reset and reused."""
    torch.manual_seed(0)
    cache = BlockedSSMCache(_demo_configs(torch.bfloat16))
    out = _decode_random(cache, [0, 2], 5, torch.bfloat16)
    cache.reset_slots([0])
    out2 = _decode_random(cache, [0, -1], 2, torch.bfloat16)
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "out": out, "out2": out2}


def build_packed_cache() -> Dict[str, object]:
    """The same launches on a cache whose layers are packed into one allocation each."""
    torch.manual_seed(0)
    cache = BlockedSSMCache(_demo_configs(torch.bfloat16, mode=AllocationMode.PACKED))
    out = _decode_random(cache, [0, 2], 5, torch.bfloat16)
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "out": out}


def build_cache_rebalance() -> Dict[str, object]:
    """A bf16 cache grown by two slots under load, then moved to fp16 rings, then more launches."""
    torch.manual_seed(0)
    cache = BlockedSSMCache(_demo_configs(torch.bfloat16))
    _decode_random(cache, [0, 1], 3, torch.bfloat16)
    cache.grow(2)
    cache.retype_(torch.float16)
    out = _decode_random(cache, [1, 3, 4], 3, torch.float16)
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "out": out, "num_slots": cache.num_slots}
