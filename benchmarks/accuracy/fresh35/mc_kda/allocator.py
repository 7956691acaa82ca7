"""Cache slots and the ring storage behind them.

``SlotAllocator`` hands out slot numbers from a free list and keeps the int32 row->slot table
the kernels index with. Ring storage comes in two forms with the same slot API
(``ring_args``/``slot_tensors``/``load_slot``/``reset_slot``):

* ``RingPool``: plain tensors owned by a worker (the decode side), dtypes from ``RingDtypes``;
* ``KDARingCache``: module buffers, for models that carry their caches (the prefill side), so
  that moving the model moves them.
"""

from typing import Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from .config import KDAShapes, RingDtypes
from .ops import replayssm
from .transfer.metadata import SLOT_TENSORS, SlotLayoutMeta


class SlotAllocator:
    def __init__(self, num_slots: int, max_batch: int = 8) -> None:
        self.num_slots = num_slots
        self.free_slots: List[int] = list(range(num_slots))
        self.slot_of: Dict[str, int] = {}
        self.slot_table = torch.full((max_batch,), -1, dtype=torch.int32)

    def allocate(self, request_id: str) -> int:
        if request_id in self.slot_of:
            return self.slot_of[request_id]
        if not self.free_slots:
            raise RuntimeError(f"no free cache slot for {request_id!r} ({self.num_slots} slots)")
        slot = self.free_slots.pop(0)
        self.slot_of[request_id] = slot
        return slot

    def free(self, request_id: str) -> int:
        slot = self.slot_of.pop(request_id)
        self.free_slots.append(slot)
        self.free_slots.sort()
        return slot

    def extend(self, extra: int) -> None:
        self.free_slots.extend(range(self.num_slots, self.num_slots + extra))
        self.num_slots += extra

    def slot_index(self, request_ids: Sequence[Optional[str]]) -> Tensor:
        """Slots of a batch (``None``: a padding row), as the kernels' int32 ``slot_idx``."""
        rows = [-1 if rid is None else self.slot_of[rid] for rid in request_ids]
        self.slot_table.fill_(-1)
        self.slot_table[: len(rows)] = torch.tensor(rows, dtype=torch.int32)
        return self.slot_table[: len(rows)].clone()


class _SlotRings:
    def ring_args(self) -> Dict[str, Tensor]:
        return {"state": self.ckpt_state, "d_cache": self.delta_ring, "k_cache": self.key_ring, "g_cache": self.forget_ring}

    def slot_tensors(self, slot: int) -> Dict[str, Tensor]:
        return {name: getattr(self, name)[slot] for name in SLOT_TENSORS}

    def load_slot(self, slot: int, tensors: Mapping[str, Tensor]) -> None:
        for name, tensor in tensors.items():
            getattr(self, name)[slot].copy_(tensor)

    def reset_slot(self, slot: int) -> None:
        for name in SLOT_TENSORS:
            getattr(self, name)[slot].zero_()


class RingPool(_SlotRings):
    """One layer's rings for ``num_slots`` sequences."""

    def __init__(self, shapes: KDAShapes, num_slots: int, dtypes: RingDtypes) -> None:
        self.num_slots = num_slots
        self.ring_len = shapes.ring_len
        self.dtypes = dtypes
        self.ckpt_state = torch.zeros((num_slots, *shapes.state), dtype=torch.float32)
        self.delta_ring = torch.zeros((num_slots, *shapes.delta), dtype=dtypes.delta)
        self.key_ring = torch.zeros((num_slots, *shapes.key), dtype=dtypes.key)
        self.forget_ring = torch.zeros((num_slots, *shapes.forget), dtype=dtypes.forget)
        self.cursor = torch.zeros(num_slots, dtype=torch.int32)

    @classmethod
    def from_layout(cls, meta: SlotLayoutMeta, num_slots: int, dtype: torch.dtype) -> "RingPool":
        """A pool shaped like a peer's slot header (``--layout-from-peer``), rings in ``dtype``."""
        pool = cls.__new__(cls)
        pool.num_slots = num_slots
        for entry in meta.entries:
            shape = (num_slots, *entry.shape)
            if entry.name == "ckpt_state":
                pool.ckpt_state = torch.zeros(shape, dtype=torch.float32)
            elif entry.name == "cursor":
                pool.cursor = torch.zeros(shape, dtype=torch.int32)
            else:
                setattr(pool, entry.name, torch.zeros(shape, dtype=dtype))  # expect-bug: pool-dtype
        pool.ring_len = pool.delta_ring.shape[2]
        pool.dtypes = RingDtypes(pool.delta_ring.dtype, pool.key_ring.dtype, pool.forget_ring.dtype)
        return pool

    def grow(self, extra: int) -> "RingPool":
        """Adds ``extra`` empty slots, keeping the existing ones."""
        for name in SLOT_TENSORS:
            old = getattr(self, name)
            setattr(self, name, torch.cat([old, old.new_zeros((extra, *old.shape[1:]))]))
        self.num_slots += extra
        return self

    def to(self, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> "RingPool":
        """Moves the pool; ``dtype`` re-types the rings (the checkpoint and cursors keep theirs)."""
        self.ckpt_state = self.ckpt_state.to(device=device)
        self.cursor = self.cursor.to(device=device)
        for name in ("delta_ring", "key_ring", "forget_ring"):
            setattr(self, name, getattr(self, name).to(device=device, dtype=dtype))  # expect-bug: cast id=pool-cast
        return self


class KDARingCache(_SlotRings, nn.Module):
    """A layer's rings as (non-persistent) module buffers."""

    def __init__(self, shapes: KDAShapes, num_slots: int, ring_dtype: torch.dtype) -> None:
        super().__init__()
        self.ring_len = shapes.ring_len
        self.register_buffer("ckpt_state", torch.zeros((num_slots, *shapes.state), dtype=torch.float32), persistent=False)
        self.register_buffer("delta_ring", torch.zeros((num_slots, *shapes.delta), dtype=ring_dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros((num_slots, *shapes.key), dtype=ring_dtype), persistent=False)
        self.register_buffer("forget_ring", torch.zeros(num_slots, *shapes.forget), persistent=False)  # expect-bug: default-dtype id=init-dtype; default-dtype id=proc-default
        self.register_buffer("cursor", torch.zeros(num_slots, dtype=torch.int32), persistent=False)


class PinnedKDARingCache(KDARingCache):
    """A ``KDARingCache`` whose log-decay ring keeps float32 when the owning model is cast."""

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        forget = self._buffers.pop("forget_ring")
        try:
            super()._apply(fn, recurse)
        finally:
            self._buffers["forget_ring"] = forget.to(self.ckpt_state.device)
        return self


def prefilled_pools(dtype: torch.dtype, prompt: Sequence[int], num_slots: int = 2, seed: int = 0) -> List[RingPool]:
    """Pools of a two-layer model after ``prompt`` ran on slot 0."""
    torch.manual_seed(seed)
    shapes = KDAShapes()
    model = replayssm.TinyKDAModel(shapes, dtype=dtype)
    pools = [RingPool(shapes, num_slots, RingDtypes.for_model(dtype)) for _ in model.layers]
    replayssm.run_tokens(model, pools, [0], [[token] for token in prompt])
    return pools


def build_ring_pool() -> Dict[str, object]:
    """Two requests and a padding row on bf16 pools, a released slot reused as a fork of another
    request, the pools grown by one slot and moved, then more steps."""
    torch.manual_seed(0)
    shapes = KDAShapes()
    model = replayssm.TinyKDAModel(shapes, dtype=torch.bfloat16)
    allocator = SlotAllocator(3)
    pools = [RingPool(shapes, 3, RingDtypes.for_model(torch.bfloat16)) for _ in model.layers]
    a, b = allocator.allocate("a"), allocator.allocate("b")
    replayssm.run_tokens(model, pools, [a, -1, b], [[3, 0, 4], [5, 0, 6], [7, 0, 8]])
    allocator.free("a")
    c = allocator.allocate("c")
    for pool in pools:
        pool.reset_slot(c)
        pool.load_slot(c, pool.slot_tensors(b))
        pool.grow(1).to(device="cpu")
    allocator.extend(1)
    allocator.allocate("d")
    replayssm.run_tokens(model, pools, allocator.slot_index(["b", "c", "d"]).tolist(), [[9, 10, 11], [12, 13, 14]])
    return {"pools": pools, "slot_table": allocator.slot_index(["b", "c", "d"]), "fork": pools[0].slot_tensors(c)}


def build_pool_from_peer_layout() -> Dict[str, object]:
    """A decode pool laid out from a bf16 prefill slot's header, then used for three steps."""
    torch.manual_seed(0)
    shapes = KDAShapes()
    peer = prefilled_pools(torch.bfloat16, [3, 5])
    meta = SlotLayoutMeta.describe(0, 2, peer[0].slot_tensors(0), "bfloat16")
    pools = [RingPool.from_layout(meta, 3, torch.bfloat16) for _ in peer]
    for pool, src in zip(pools, peer):
        pool.load_slot(1, src.slot_tensors(0))
    model = replayssm.TinyKDAModel(shapes, dtype=torch.bfloat16)
    replayssm.run_tokens(model, pools, [1], [[7], [9], [11]])
    return {"pools": pools}
