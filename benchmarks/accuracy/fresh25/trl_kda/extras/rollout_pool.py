# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Rollout ring pools: the ReplaySSM decode state of every sequence a rollout generates.

A pool owns, for all KDA layers at once, the checkpoints ``state [layers, slots, HV, V, K]``,
the rings ``delta_ring [layers, slots, HV, L, V]``, ``key_ring [layers, slots, H, L, K]`` and
``logdecay_ring [layers, slots, HV, L, K]``, and one int32 cursor per slot. Slots are handed
out to sequences and returned when they finish; :meth:`RolloutRingPool.layer` gives the
per-layer views the decode kernel takes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from trl_kda.models.replayssm import advance_write_pos
from trl_kda.trainer.grpo_config import RolloutBufferDtypes

__all__ = ["LayerRings", "PackedRolloutRingPool", "PromptRingCache", "RingGeometry", "RingSnapshot", "RolloutRingPool"]


@dataclass(frozen=True)
class RingGeometry:
    num_layers: int
    num_slots: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    ring_len: int

    @classmethod
    def from_model_config(cls, config: Any, num_slots: int, ring_len: int | None = None) -> RingGeometry:
        return cls(
            num_layers=config.num_hidden_layers,
            num_slots=num_slots,
            num_k_heads=config.num_heads,
            num_v_heads=config.num_v_heads,
            head_k_dim=config.head_dim,
            head_v_dim=config.v_head_dim,
            ring_len=ring_len or config.replay_ring_len,
        )

    def state_shape(self, num_slots: int | None = None) -> tuple[int, ...]:
        n = self.num_slots if num_slots is None else num_slots
        return (self.num_layers, n, self.num_v_heads, self.head_v_dim, self.head_k_dim)

    def ring_shapes(self, num_slots: int | None = None) -> dict[str, tuple[int, ...]]:
        n = self.num_slots if num_slots is None else num_slots
        L = self.ring_len
        return {
            "delta_ring": (self.num_layers, n, self.num_v_heads, L, self.head_v_dim),
            "key_ring": (self.num_layers, n, self.num_k_heads, L, self.head_k_dim),
            "logdecay_ring": (self.num_layers, n, self.num_v_heads, L, self.head_k_dim),
        }


class LayerRings(NamedTuple):
    """Views of one layer's decode state, in the layout the decode kernel takes."""

    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    logdecay_ring: torch.Tensor
    write_pos: torch.Tensor


class RingSnapshot(NamedTuple):
    """Host copies of some slots of a pool (all layers)."""

    slots: torch.Tensor
    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    logdecay_ring: torch.Tensor
    write_pos: torch.Tensor


class RolloutRingPool:
    """Decode state of ``geometry.num_slots`` sequences; d/k rings in ``dtype``."""

    ring_names: tuple[str, ...] = ("delta_ring", "key_ring", "logdecay_ring")
    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    logdecay_ring: torch.Tensor
    write_pos: torch.Tensor

    def __init__(
        self,
        geometry: RingGeometry,
        dtype: torch.dtype = torch.bfloat16,
        *,
        key_dtype: torch.dtype | None = None,
        gate_dtype: torch.dtype = torch.float32,
        state_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.geometry = geometry
        self.dtype = dtype
        self.device = torch.device(device)
        self.state = torch.zeros(geometry.state_shape(), dtype=state_dtype, device=self.device)
        ring_dtypes = {"delta_ring": dtype, "key_ring": key_dtype or dtype, "logdecay_ring": gate_dtype}
        for name, shape in geometry.ring_shapes().items():
            setattr(self, name, torch.zeros(shape, dtype=ring_dtypes[name], device=self.device))
        self.write_pos = torch.zeros(geometry.num_slots, dtype=torch.int32, device=self.device)
        self._free: list[int] = list(range(geometry.num_slots))

    @classmethod
    def from_buffer_dtypes(
        cls, geometry: RingGeometry, dtypes: RolloutBufferDtypes, device: str | torch.device = "cpu"
    ) -> RolloutRingPool:
        return cls(geometry, dtypes.delta, key_dtype=dtypes.key, gate_dtype=dtypes.logdecay, device=device)  # expect-bug: container id=buffer-dtypes

    @property
    def num_slots(self) -> int:
        return self.geometry.num_slots

    def named_states(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield "state", self.state
        for name in self.ring_names:
            yield name, getattr(self, name)
        yield "write_pos", self.write_pos

    def layer(self, idx: int) -> LayerRings:
        return LayerRings(self.state[idx], self.delta_ring[idx], self.key_ring[idx], self.logdecay_ring[idx], self.write_pos)

    def allocate(self, count: int) -> torch.Tensor:
        """``count`` free slots (int32), lowest first."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} slots, {len(self._free)} free")
        taken, self._free = self._free[:count], self._free[count:]
        return torch.tensor(taken, dtype=torch.int32, device=self.device)

    def release(self, slots: torch.Tensor) -> None:
        self._free = sorted(set(self._free) | {int(s) for s in slots.tolist() if s >= 0})

    def reset_slots(self, slots: torch.Tensor) -> None:
        index = slots.long()
        for _, tensor in self.named_states():
            if tensor.dim() == 1:
                tensor[index] = 0
            else:
                tensor[:, index] = 0

    def advance(self, slots: torch.Tensor, force_flush: torch.Tensor | None = None) -> None:
        advance_write_pos(self.write_pos, slots, self.geometry.ring_len, force_flush)

    def resize(self, num_slots: int) -> None:
        """Grows or shrinks the pool; the first ``min(old, new)`` slots keep their state."""
        keep = min(self.num_slots, num_slots)
        grown_state = self.state.new_zeros(self.geometry.state_shape(num_slots))
        grown_state[:, :keep] = self.state[:, :keep]
        self.state = grown_state
        for name, shape in self.geometry.ring_shapes(num_slots).items():
            ring = getattr(self, name)
            grown = ring.new_zeros(shape)
            grown[:, :keep] = ring[:, :keep]
            setattr(self, name, grown)
        cursors = self.write_pos.new_zeros(num_slots)
        cursors[:keep] = self.write_pos[:keep]
        self.write_pos = cursors
        self._free = [slot for slot in self._free if slot < num_slots] + list(range(self.num_slots, num_slots))
        self.geometry = replace(self.geometry, num_slots=num_slots)

    def snapshot_slots(self, slots: torch.Tensor) -> RingSnapshot:
        """Copies the rows of ``slots`` to host memory, e.g. before a rollout is preempted."""
        index = slots.long()
        state = torch.empty_like(self.state[:, index], device="cpu")
        delta_ring = torch.empty_like(self.delta_ring[:, index], device="cpu")
        key_ring = torch.empty_like(self.key_ring[:, index], device="cpu")
        logdecay_ring = torch.empty_like(delta_ring)  # expect-bug: like
        state.copy_(self.state[:, index])
        delta_ring.copy_(self.delta_ring[:, index])
        key_ring.copy_(self.key_ring[:, index])
        logdecay_ring.copy_(self.logdecay_ring[:, index])
        return RingSnapshot(slots.clone(), state, delta_ring, key_ring, logdecay_ring, self.write_pos[index].cpu())

    def restore_slots(self, snapshot: RingSnapshot, slots: torch.Tensor | None = None) -> None:
        """Writes a snapshot back, into its own slots or into ``slots``; rings keep their dtypes."""
        index = (snapshot.slots if slots is None else slots).long()
        for name in ("state", *self.ring_names):
            target = getattr(self, name)
            target[:, index] = getattr(snapshot, name).to(device=self.device, dtype=target.dtype)
        self.write_pos[index] = snapshot.write_pos.to(self.device, torch.int32)


class PackedRolloutRingPool(RolloutRingPool):
    """A pool whose rings share one dtype, so a slot's rings pack into one transfer buffer."""

    def __init__(self, geometry: RingGeometry, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> None:
        self.geometry = geometry
        self.dtype = dtype
        self.device = torch.device(device)
        self.state = torch.zeros(geometry.state_shape(), dtype=torch.float32, device=self.device)
        for name, shape in geometry.ring_shapes().items():
            setattr(self, name, torch.zeros(shape, dtype=self.dtype, device=self.device))  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(geometry.num_slots, dtype=torch.int32, device=self.device)
        self._free = list(range(geometry.num_slots))

    def pack_slot(self, slot: int) -> torch.Tensor:
        """All rings of ``slot`` as one flat tensor of the pool dtype."""
        return torch.cat([getattr(self, name)[:, slot].reshape(-1) for name in self.ring_names])

    def unpack_slot(self, slot: int, packed: torch.Tensor) -> None:
        offset = 0
        for name in self.ring_names:
            rows = getattr(self, name)[:, slot]
            rows.copy_(packed[offset : offset + rows.numel()].view_as(rows))
            offset += rows.numel()


class PromptRingCache:
    """Decode state of prefilled prompts, shared by the completions sampled from each prompt.

    GRPO samples ``num_generations`` completions per prompt. The engine prefills a prompt once
    (all tokens but the last), keeps the rows here and copies them into the slot of each
    completion. Entries are evicted least recently used first.
    """

    def __init__(self, geometry: RingGeometry, capacity: int, dtype: torch.dtype = torch.bfloat16) -> None:
        shapes = geometry.ring_shapes(capacity)
        self.capacity = capacity
        self.state = torch.zeros(geometry.state_shape(capacity), dtype=torch.float32)
        self.delta_ring = torch.zeros(shapes["delta_ring"], dtype=dtype)
        self.key_ring = torch.zeros(shapes["key_ring"], dtype=dtype)
        self.logdecay_ring = torch.zeros(shapes["logdecay_ring"])  # expect-bug: default-dtype
        self.write_pos = torch.zeros(capacity, dtype=torch.int32)
        self._rows: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self.hits = 0

    def lookup(self, prefix: Sequence[int]) -> int | None:
        row = self._rows.get(tuple(prefix))
        if row is not None:
            self._rows.move_to_end(tuple(prefix))
            self.hits += 1
        return row

    def insert(self, prefix: Sequence[int], pool: RolloutRingPool, slot: int) -> int:
        key = tuple(prefix)
        if key in self._rows:
            return self._rows[key]
        if len(self._rows) < self.capacity:
            row = len(self._rows)
        else:
            _, row = self._rows.popitem(last=False)
        self.state[:, row] = pool.state[:, slot]
        self.delta_ring[:, row] = pool.delta_ring[:, slot]
        self.key_ring[:, row] = pool.key_ring[:, slot]
        self.logdecay_ring[:, row] = pool.logdecay_ring[:, slot]
        self.write_pos[row] = pool.write_pos[slot]
        self._rows[key] = row
        return row

    def copy_to(self, row: int, pool: RolloutRingPool, slots: torch.Tensor) -> None:
        for slot in slots.tolist():
            pool.state[:, slot] = self.state[:, row]
            pool.delta_ring[:, slot] = self.delta_ring[:, row]
            pool.key_ring[:, slot] = self.key_ring[:, row]
            pool.logdecay_ring[:, slot] = self.logdecay_ring[:, row]
            pool.write_pos[slot] = self.write_pos[row]

    def clear(self) -> None:
        self._rows.clear()


def _tiny_geometry(num_slots: int = 3) -> RingGeometry:
    return RingGeometry(
        num_layers=2, num_slots=num_slots, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, ring_len=4
    )


def _fill(pool: RolloutRingPool, slots: torch.Tensor, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    index = slots.long()
    for name, tensor in pool.named_states():
        if name == "write_pos":
            tensor[index] = torch.arange(len(index), dtype=torch.int32) + 1
        else:
            rows = tensor[:, index]
            values = torch.randn(rows.shape, generator=generator)
            tensor[:, index] = (-values.abs() if name == "logdecay_ring" else values).to(tensor.dtype)


def build_rollout_pool_bf16() -> dict[str, Any]:
    """bf16 d/k rings next to float32 log-decays: fill, advance, grow, restore, cache a prompt."""
    pool = RolloutRingPool(_tiny_geometry(), dtype=torch.bfloat16)
    slots = pool.allocate(2)
    _fill(pool, slots, seed=7)
    pool.advance(slots, force_flush=torch.tensor([0, 1], dtype=torch.int32))
    pool.resize(5)
    host = RingSnapshot(
        slots=torch.tensor([4], dtype=torch.int32),
        state=torch.ones(2, 1, 4, 8, 8),
        delta_ring=torch.full((2, 1, 4, 4, 8), 0.25),
        key_ring=torch.full((2, 1, 2, 4, 8), 0.5),
        logdecay_ring=torch.full((2, 1, 4, 4, 8), -0.125, dtype=torch.float64),
        write_pos=torch.tensor([2]),
    )
    pool.restore_slots(host)
    prompt_cache = PromptRingCache(pool.geometry, capacity=2, dtype=torch.bfloat16)
    row = prompt_cache.insert([3, 1, 4], pool, slot=0)
    prompt_cache.copy_to(row, pool, pool.allocate(2))
    return {"pool": pool, "prompt_cache": prompt_cache}


def build_packed_pool() -> PackedRolloutRingPool:
    """A packed bf16 pool round-tripping one slot through its transfer buffer."""
    pool = PackedRolloutRingPool(_tiny_geometry(), dtype=torch.bfloat16)
    slots = pool.allocate(3)
    _fill(pool, slots, seed=11)
    packed = pool.pack_slot(1)
    pool.reset_slots(slots[1:2])
    pool.unpack_slot(2, packed)
    pool.advance(slots)
    return pool


def build_grpo_rollout_pool() -> dict[str, Any]:
    """A trainer pool from the config's buffer dtypes, and a preemption snapshot of another pool."""
    geometry = _tiny_geometry()
    rollout = RolloutRingPool.from_buffer_dtypes(geometry, RolloutBufferDtypes())
    _fill(rollout, rollout.allocate(2), seed=3)
    serving = RolloutRingPool(geometry, dtype=torch.bfloat16)
    slots = serving.allocate(2)
    _fill(serving, slots, seed=5)
    preempted = serving.snapshot_slots(slots)
    serving.release(slots)
    return {"rollout": rollout, "preempted": preempted, "serving": serving}
