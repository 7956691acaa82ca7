# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Slot-indexed pools of ReplaySSM decode caches for serving.

A pool holds, for every KDA layer, the float32 checkpoints, the delta/key/log-decay rings and
the write positions of ``num_slots`` sequences. Requests are admitted to a free slot and
evicted when they finish; :meth:`ReplayCachePool.grow` adds slots when the scheduler raises
the batch size.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from foundry_kda import registry
from foundry_kda.models.kda_attention import ReplaySpec
from foundry_kda.precision import Precision, RingDtypes, ring_dtypes_for, to_precision

log = logging.getLogger(__name__)

__all__ = [
    "SERVING_RING_DTYPES",
    "LayerRings",
    "ReplayCachePool",
    "StaticReplayCache",
    "TINY_REPLAY_SPEC",
    "make_replay_cache_pool",
    "randomize_",
]


@dataclass
class LayerRings:
    """One layer's replay cache as plain tensors."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.d_cache.shape[0]

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for item in dataclasses.fields(self):
            yield item.name, getattr(self, item.name)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.items())

    @torch.no_grad()
    def zero_(self, slots: Sequence[int] | None = None) -> LayerRings:
        for _, tensor in self.items():
            if slots is None:
                tensor.zero_()
            else:
                tensor[list(slots)] = 0
        return self


class ReplayCachePool:
    """Replay caches of every KDA layer for ``num_slots`` concurrent sequences.

    Args:
        spec: Layer count and head geometry of the model.
        num_slots: Number of sequences that can decode at once.
        ring_len: Ring length ``L``; the ring is folded into the checkpoint every ``L`` steps.
        dtype: Dtype of the delta and key rings when ``ring_dtypes`` is not given.
        ring_dtypes: Storage dtypes of every part of the cache.
        device: Where the caches live.
    """

    def __init__(
        self,
        spec: ReplaySpec,
        num_slots: int,
        ring_len: int,
        dtype: torch.dtype = torch.bfloat16,
        ring_dtypes: RingDtypes | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.spec = spec
        self.ring_len = ring_len
        self.dtype = dtype
        self.ring_dtypes = ring_dtypes or RingDtypes(delta=dtype, key=dtype)
        self.device = torch.device(device)
        self.layers: list[LayerRings] = [self._allocate_layer(num_slots) for _ in range(spec.num_layers)]
        self._free: list[int] = list(range(num_slots))

    @property
    def num_slots(self) -> int:
        return self.layers[0].num_slots if self.layers else 0

    def _allocate_layer(self, num_slots: int) -> LayerRings:
        shapes = self.spec.ring_shapes(num_slots, self.ring_len)
        dtypes = self.ring_dtypes
        return LayerRings(
            state=torch.zeros(shapes["state"], dtype=dtypes.state, device=self.device),
            d_cache=torch.zeros(shapes["d_cache"], dtype=dtypes.delta, device=self.device),
            k_cache=torch.zeros(shapes["k_cache"], dtype=dtypes.key, device=self.device),
            g_cache=torch.zeros(shapes["g_cache"], dtype=dtypes.gate, device=self.device),
            write_pos=torch.zeros(num_slots, dtype=torch.int32, device=self.device),
        )

    def admit(self) -> int:
        """A free slot, zeroed, for a new sequence."""
        if not self._free:
            raise RuntimeError("no free decode slot; grow() the pool or wait for an eviction")
        slot = self._free.pop(0)
        for rings in self.layers:
            rings.zero_([slot])
        return slot

    @torch.no_grad()
    def grow(self, num_slots: int) -> None:
        """Reallocates every layer for ``num_slots`` slots, keeping the slots in use."""
        old = self.num_slots
        if num_slots <= old:
            return
        for index, rings in enumerate(self.layers):
            state = rings.state.new_zeros((num_slots, *rings.state.shape[1:]))
            d_cache = rings.d_cache.new_zeros((num_slots, *rings.d_cache.shape[1:]))
            k_cache = rings.k_cache.new_zeros((num_slots, *rings.k_cache.shape[1:]))
            g_cache = torch.zeros(
                (num_slots, *rings.g_cache.shape[1:]), dtype=self.dtype, device=self.device
            )  # expect-bug: pool-dtype
            write_pos = rings.write_pos.new_zeros(num_slots)
            for new, current in (
                (state, rings.state),
                (d_cache, rings.d_cache),
                (k_cache, rings.k_cache),
                (g_cache, rings.g_cache),
                (write_pos, rings.write_pos),
            ):
                new[:old] = current
            self.layers[index] = LayerRings(state, d_cache, k_cache, g_cache, write_pos)
        self._free.extend(range(old, num_slots))
        log.info("replay cache pool grown from %d to %d slots", old, num_slots)

    def gather(self, slots: Sequence[int]) -> list[LayerRings]:
        """Copies of the given slots of every layer (dtypes kept)."""
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.device)
        return [LayerRings(*(t.index_select(0, index) for _, t in rings.items())) for rings in self.layers]

    @classmethod
    def for_serving(
        cls,
        spec: ReplaySpec,
        num_slots: int,
        ring_len: int,
        precision: str | Precision,
        device: torch.device | str = "cpu",
    ) -> ReplayCachePool:
        precision = to_precision(precision)
        dtypes = SERVING_RING_DTYPES[precision]
        return cls(spec, num_slots, ring_len, dtype=dtypes.delta, ring_dtypes=dtypes, device=device)


#: Ring dtypes of the serving presets. fp16 serving keeps deltas and keys in fp16, which the
#: fp16 decode kernel reads natively.
SERVING_RING_DTYPES: dict[Precision, RingDtypes] = {
    Precision.FP32: RingDtypes(delta=torch.float32, key=torch.float32),
    Precision.AMP_BF16: RingDtypes(delta=torch.bfloat16, key=torch.bfloat16),
    Precision.AMP_FP16: RingDtypes(delta=torch.float16, key=torch.float16, gate=torch.float16),
}  # expect-bug: container


class StaticReplayCache(nn.Module):
    """A fixed-size replay cache of one layer as module buffers (eval and batch inference).

    The log-decay ring is the ``log_decay_ring`` buffer; ``g_cache`` is an alias so that the
    cache can be handed to the KDA decode path like any other replay cache.
    """

    def __init__(
        self,
        spec: ReplaySpec,
        num_slots: int,
        ring_len: int,
        dtype: torch.dtype = torch.bfloat16,
        gate_dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shapes = spec.ring_shapes(num_slots, ring_len)
        self.register_buffer("state", torch.zeros(shapes["state"], dtype=torch.float32, device=device))
        self.register_buffer("d_cache", torch.zeros(shapes["d_cache"], dtype=dtype, device=device))
        self.register_buffer("k_cache", torch.zeros(shapes["k_cache"], dtype=dtype, device=device))
        self.register_buffer(
            "log_decay_ring", torch.zeros(shapes["g_cache"], dtype=gate_dtype, device=device)
        )
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device))

    @property
    def g_cache(self) -> torch.Tensor:
        return self.log_decay_ring

    @torch.no_grad()
    def reset(self) -> None:
        for buffer in self.buffers():
            buffer.zero_()


@registry.cache_pools.register("replay")
def make_replay_cache_pool(
    spec: ReplaySpec,
    num_slots: int,
    ring_len: int,
    precision: str | Precision = Precision.AMP_BF16,
    device: torch.device | str = "cpu",
) -> ReplayCachePool:
    dtypes = ring_dtypes_for(precision)
    return ReplayCachePool(spec, num_slots, ring_len, dtype=dtypes.delta, ring_dtypes=dtypes, device=device)


registry.cache_pools.register("replay_serving", ReplayCachePool.for_serving)

#: Geometry of the two-layer debug model (``KimiLinearConfig()``).
TINY_REPLAY_SPEC = ReplaySpec(num_layers=2, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)


def randomize_(pool: ReplayCachePool, seed: int = 0) -> ReplayCachePool:
    """Fills ``pool`` with random, well-formed contents (negative log-decays, valid positions).

    Used to exercise the decode kernels on a fresh pool before it takes traffic.
    """
    generator = torch.Generator().manual_seed(seed)
    for rings in pool.layers:
        for name, tensor in rings.items():
            if tensor.is_floating_point():
                values = torch.randn(tensor.shape, generator=generator)
                tensor.copy_(-values.abs() if name == "g_cache" else values)
        rings.write_pos.copy_(torch.arange(rings.num_slots, dtype=torch.int32) % pool.ring_len)
    return pool


def build_cache_pool_bf16() -> dict[str, object]:
    """A bf16 pool from the registry, filled, with a slot admitted and a gathered copy."""
    torch.manual_seed(0)
    pool = registry.cache_pools.get("replay")(TINY_REPLAY_SPEC, num_slots=3, ring_len=4, precision="amp_bf16")
    randomize_(pool)
    slot = pool.admit()
    return {"pool": pool.layers, "slot": torch.tensor(slot), "gathered": pool.gather([1, 2])}


def build_serving_pools() -> dict[str, object]:
    """An fp16 serving pool, and a bf16 pool grown from two to four slots."""
    torch.manual_seed(0)
    fp16_pool = randomize_(
        ReplayCachePool.for_serving(TINY_REPLAY_SPEC, num_slots=2, ring_len=4, precision="amp_fp16")
    )
    grown = randomize_(
        ReplayCachePool(TINY_REPLAY_SPEC, num_slots=2, ring_len=4, dtype=torch.bfloat16), seed=1
    )
    grown.grow(4)
    return {"fp16": fp16_pool.layers, "grown": grown.layers}
