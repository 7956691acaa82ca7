"""Slot pools for the ReplaySSM caches of the KDA layers.

Each slot holds one sequence's checkpoint state and its three rings. The router hands every
request a slot; batches carry slot indices and ring cursors, the pools stay where they are.
"""

import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from torch import nn

from ...models.globals import REPLAY_GATE_DTYPE, get_cache_dtype
from .replay import gate_dtype_for


class ReplaySpec(NamedTuple):
    num_heads: int
    num_v_heads: int
    head_k: int
    head_v: int
    ring_len: int

    def state_shape(self, num_slots: int):
        return (num_slots, self.num_v_heads, self.head_v, self.head_k)

    def delta_shape(self, num_slots: int):
        return (num_slots, self.num_v_heads, self.ring_len, self.head_v)

    def key_shape(self, num_slots: int):
        return (num_slots, self.num_heads, self.ring_len, self.head_k)

    def decay_shape(self, num_slots: int):
        return (num_slots, self.num_v_heads, self.ring_len, self.head_k)


class ReplayRows(NamedTuple):
    """The rows of some slots, in the order the decode kernel takes them."""

    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_ring: torch.Tensor


class ReplayCache(nn.Module):
    """State and rings of one KDA layer for ``num_slots`` slots, as module buffers.

    The pools are registered on the model (see ``FlashKimiForCausalLM.set_replay_caches``) so
    that they follow it across devices.
    """

    BUFFER_NAMES = ("state", "delta_ring", "key_ring", "decay_ring")

    def __init__(
        self,
        spec: ReplaySpec,
        num_slots: int,
        dtype: torch.dtype,
        device=None,
        state_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        self.spec = spec
        self.dtype = dtype
        self.register_buffer(
            "state",
            torch.zeros(spec.state_shape(num_slots), dtype=state_dtype or dtype, device=device),
        )
        self.register_buffer(
            "delta_ring", torch.zeros(spec.delta_shape(num_slots), dtype=dtype, device=device)
        )
        self.register_buffer(
            "key_ring", torch.zeros(spec.key_shape(num_slots), dtype=dtype, device=device)
        )
        self.register_buffer(
            "decay_ring",
            torch.zeros(spec.decay_shape(num_slots), dtype=REPLAY_GATE_DTYPE, device=device),
        )

    @classmethod
    def from_tensors(cls, spec: ReplaySpec, state, delta_ring, key_ring, decay_ring):
        """A cache over existing tensors (views into a larger pool, restored checkpoints)."""
        cache = cls.__new__(cls)
        nn.Module.__init__(cache)
        cache.spec = spec
        cache.dtype = delta_ring.dtype
        for name, tensor in zip(cls.BUFFER_NAMES, (state, delta_ring, key_ring, decay_ring)):
            cache.register_buffer(name, tensor)
        return cache

    @property
    def num_slots(self) -> int:
        return self.state.shape[0]

    def rows(self, slots: torch.Tensor) -> ReplayRows:
        index = slots.long()
        return ReplayRows(*(getattr(self, name).index_select(0, index) for name in self.BUFFER_NAMES))

    def write_rows(self, slots: torch.Tensor, rows: ReplayRows):
        index = slots.long()
        for name, value in zip(self.BUFFER_NAMES, rows):
            getattr(self, name).index_copy_(0, index, value.to(getattr(self, name).dtype))

    def reset_slots(self, slots: torch.Tensor):
        for name in self.BUFFER_NAMES:
            getattr(self, name)[slots.long()] = 0

    def extend(self, num_slots: int):
        """Grows the pool by ``num_slots`` slots, keeping the rows of the existing ones."""
        for name in self.BUFFER_NAMES:
            old = getattr(self, name)
            new = torch.zeros((old.shape[0] + num_slots, *old.shape[1:]), dtype=self.dtype, device=old.device)  # expect-bug: pool-dtype
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def offload(self) -> ReplayRows:
        """Host copies of every slot, kept while the device pool is rebuilt."""
        return ReplayRows(
            state=self.state.to("cpu", copy=True),
            delta_ring=self.delta_ring.to("cpu", copy=True),
            key_ring=self.key_ring.to("cpu", copy=True),
            decay_ring=self.decay_ring.to(device="cpu", dtype=self.dtype, copy=True),  # expect-bug: cast
        )

    def snapshot(self, path):
        payload = {"spec": torch.tensor(list(self.spec), dtype=torch.int64)}
        payload.update({name: tensor.detach().cpu() for name, tensor in self.state_dict().items()})
        torch.save(payload, path)

    def load_snapshot(self, path):
        payload = torch.load(path, map_location="cpu", weights_only=True)
        spec = ReplaySpec(*payload.pop("spec").tolist())
        if spec != self.spec:
            raise ValueError(f"snapshot of a {spec} cache cannot be loaded into a {self.spec} cache")
        self.load_state_dict(payload)

    @classmethod
    def from_snapshot(cls, path, dtype: torch.dtype, device=None):
        """A new cache with the slots of a snapshot, in the serving dtype."""
        payload = torch.load(path, map_location="cpu", weights_only=True)
        spec = ReplaySpec(*payload.pop("spec").tolist())
        tensors = {name: payload[name].to(device=device, dtype=dtype) for name in cls.BUFFER_NAMES}  # expect-bug: load
        return cls.from_tensors(spec, **tensors)


class ReplayCachePool:
    """The caches of all KDA layers in one allocation per cache kind.

    CUDA graphs replay against fixed addresses; one block per kind keeps every layer's pool at a
    fixed offset from the first and lets the graph inputs be a single base pointer.
    """

    def __init__(self, spec: ReplaySpec, num_layers: int, num_slots: int, dtype: torch.dtype, device=None):
        self.spec = spec
        cache_dtype = get_cache_dtype(dtype)
        self.state = torch.zeros((num_layers, *spec.state_shape(num_slots)), dtype=cache_dtype, device=device)
        self.key_ring = torch.zeros((num_layers, *spec.key_shape(num_slots)), dtype=cache_dtype, device=device)
        if spec.head_v == spec.head_k:
            # delta and decay rows are both [HV, L, K]: one block serves both rings
            value_rows = torch.zeros((2, num_layers, *spec.delta_shape(num_slots)), dtype=cache_dtype, device=device)  # expect-bug: pool-dtype
            self.delta_ring, self.decay_ring = value_rows.unbind(0)
        else:
            self.delta_ring = torch.zeros((num_layers, *spec.delta_shape(num_slots)), dtype=cache_dtype, device=device)
            self.decay_ring = torch.zeros(
                (num_layers, *spec.decay_shape(num_slots)), dtype=gate_dtype_for(cache_dtype), device=device  # expect-bug: imported-policy id=gate-dtype-for
            )

    def layer(self, layer_id: int) -> ReplayCache:
        return ReplayCache.from_tensors(
            self.spec,
            self.state[layer_id],
            self.delta_ring[layer_id],
            self.key_ring[layer_id],
            self.decay_ring[layer_id],
        )


def _fill(cache: ReplayCache, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for name in ReplayCache.BUFFER_NAMES:
        buffer = getattr(cache, name)
        values = torch.randn(buffer.shape, generator=generator)
        buffer.copy_(-values.abs() if name == "decay_ring" else values)


def build_replay_cache():
    """A bf16 pool: slots reset, gathered and written back, then a snapshot round trip."""
    torch.manual_seed(0)
    spec = ReplaySpec(num_heads=2, num_v_heads=4, head_k=8, head_v=8, ring_len=4)
    cache = ReplayCache(spec, num_slots=4, dtype=torch.bfloat16)
    _fill(cache, seed=1)
    cache.reset_slots(torch.tensor([3], dtype=torch.int32))
    rows = cache.rows(torch.tensor([0, 1], dtype=torch.int32))
    cache.write_rows(torch.tensor([2, 3], dtype=torch.int32), rows)
    restored = ReplayCache(spec, num_slots=4, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "replay-cache.pt"
        cache.snapshot(path)
        restored.load_snapshot(path)
    return {"cache": cache, "rows": rows, "restored": restored}


def build_extended_replay_cache():
    """A pool grown by two slots after its rows were copied to the host."""
    torch.manual_seed(0)
    spec = ReplaySpec(num_heads=2, num_v_heads=2, head_k=8, head_v=4, ring_len=4)
    cache = ReplayCache(spec, num_slots=2, dtype=torch.bfloat16)
    _fill(cache, seed=2)
    host = cache.offload()
    cache.extend(2)
    return {"host": host, "cache": cache}


def build_pooled_replay_caches():
    """Layer-stacked pools, one with K == V and one with K != V."""
    torch.manual_seed(0)
    square = ReplayCachePool(ReplaySpec(2, 2, 8, 8, 4), num_layers=2, num_slots=3, dtype=torch.bfloat16)
    narrow = ReplayCachePool(ReplaySpec(2, 2, 8, 4, 4), num_layers=2, num_slots=3, dtype=torch.bfloat16)
    return {
        "square": [square.layer(i) for i in range(2)],
        "narrow": [narrow.layer(i) for i in range(2)],
    }


def build_restored_replay_cache():
    """A cache rebuilt from a snapshot of a float32 replica."""
    torch.manual_seed(0)
    spec = ReplaySpec(num_heads=2, num_v_heads=2, head_k=4, head_v=4, ring_len=4)
    cache = ReplayCache(spec, num_slots=2, dtype=torch.float32)
    _fill(cache, seed=3)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "replay-cache.pt"
        cache.snapshot(path)
        restored = ReplayCache.from_snapshot(path, dtype=torch.bfloat16)
    return {"restored": restored}
