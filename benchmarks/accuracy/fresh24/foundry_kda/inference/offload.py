# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Moving replay caches out of the serving pool and back.

:class:`HostOffloader` parks the caches of preempted sequences in host memory and restores
them into their slots when the sequences are rescheduled. :class:`PrefixStore` keeps the caches
of shared prompt prefixes (system prompts) as serialized blobs, so that a new request with a
known prefix starts from its cache instead of re-running the prefix.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from foundry_kda.inference.cache_pool import (
    TINY_REPLAY_SPEC,
    LayerRings,
    ReplayCachePool,
    randomize_,
)
from foundry_kda.precision import ring_dtypes_for

__all__ = ["HostOffloader", "HostSnapshot", "PrefixStore"]


@dataclass
class HostSnapshot:
    """The caches of some slots of every layer, in host memory."""

    slots: torch.Tensor
    layers: list[LayerRings] = field(default_factory=list)


class HostOffloader:
    """Offloads slots of a :class:`ReplayCachePool` to host memory.

    Args:
        pool: The serving pool.
        host_dtype: Dtype the delta and key rings are kept in on the host; ``None`` keeps the
            pool's dtypes. Narrower rings halve the host memory and the transfer time.
        non_blocking: Issue the copies asynchronously (pinned host memory).
    """

    def __init__(
        self,
        pool: ReplayCachePool,
        host_dtype: torch.dtype | None = None,
        non_blocking: bool = False,
    ) -> None:
        self.pool = pool
        self.host_dtype = host_dtype
        self.non_blocking = non_blocking

    @torch.no_grad()
    def offload(self, slots: Sequence[int]) -> HostSnapshot:
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.pool.device)
        snapshot = HostSnapshot(slots=index.cpu())
        for rings in self.pool.layers:
            d_cache = rings.d_cache.index_select(0, index)
            k_cache = rings.k_cache.index_select(0, index)
            g_cache = rings.g_cache.index_select(0, index)
            if self.host_dtype is not None:
                d_cache = d_cache.to(self.host_dtype)
                k_cache = k_cache.to(self.host_dtype)
                g_cache = g_cache.to(self.host_dtype, non_blocking=self.non_blocking)  # expect-bug: cast
            snapshot.layers.append(
                LayerRings(
                    state=rings.state.index_select(0, index).to("cpu", non_blocking=self.non_blocking),
                    d_cache=d_cache.to("cpu", non_blocking=self.non_blocking),
                    k_cache=k_cache.to("cpu", non_blocking=self.non_blocking),
                    g_cache=g_cache.to("cpu", non_blocking=self.non_blocking),
                    write_pos=rings.write_pos.index_select(0, index).cpu(),
                )
            )
        return snapshot

    @torch.no_grad()
    def restore(self, snapshot: HostSnapshot, slots: Sequence[int] | None = None) -> None:
        """Writes ``snapshot`` back into the pool, into ``slots`` or the slots it came from."""
        index = snapshot.slots if slots is None else torch.as_tensor(list(slots), dtype=torch.long)
        index = index.to(self.pool.device)
        for rings, saved in zip(self.pool.layers, snapshot.layers, strict=True):
            for name, target in rings.items():
                source = getattr(saved, name).to(device=target.device, dtype=target.dtype)
                target.index_copy_(0, index, source)


class PrefixStore:
    """Serialized replay caches of prompt prefixes, keyed by the prefix's hash.

    Args:
        dtype: Dtype the delta and key rings are served in.
        device: Where fetched caches are put.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        self.dtype = dtype
        self.device = torch.device(device)
        self._blobs: dict[str, bytes] = {}

    @torch.no_grad()
    def put(self, key: str, pool: ReplayCachePool, slot: int) -> None:
        entries = [
            {name: tensor[slot].detach().cpu().clone() for name, tensor in rings.items()}
            for rings in pool.layers
        ]
        buffer = io.BytesIO()
        torch.save(entries, buffer)
        self._blobs[key] = buffer.getvalue()

    def _entries(self, key: str) -> list[dict[str, torch.Tensor]]:
        return torch.load(io.BytesIO(self._blobs[key]), map_location="cpu", weights_only=True)

    @torch.no_grad()
    def fetch(self, key: str) -> list[LayerRings]:
        """The stored prefix as single-slot caches on ``device``, rings in the serving dtype."""
        restored = []
        for entry in self._entries(key):
            d_cache = entry["d_cache"].to(device=self.device, dtype=self.dtype)
            k_cache = entry["k_cache"].to(device=self.device, dtype=self.dtype)
            g_cache = entry["g_cache"].to(device=self.device, dtype=self.dtype)  # expect-bug: load
            restored.append(
                LayerRings(
                    state=entry["state"].to(self.device).unsqueeze(0),
                    d_cache=d_cache.unsqueeze(0),
                    k_cache=k_cache.unsqueeze(0),
                    g_cache=g_cache.unsqueeze(0),
                    write_pos=entry["write_pos"].to(self.device).reshape(1),
                )
            )
        return restored

    @torch.no_grad()
    def fetch_into(self, key: str, pool: ReplayCachePool, slot: int) -> None:
        """Copies the stored prefix into ``slot`` of ``pool`` (the pool's dtypes are kept)."""
        for rings, entry in zip(pool.layers, self._entries(key), strict=True):
            for name, tensor in entry.items():
                getattr(rings, name)[slot].copy_(tensor)


def build_offload_roundtrip() -> dict[str, object]:
    """Offload two slots, clear them, restore them swapped, and serve a stored prefix."""
    torch.manual_seed(0)
    pool = randomize_(ReplayCachePool(TINY_REPLAY_SPEC, 3, 4, ring_dtypes=ring_dtypes_for("amp_bf16")))
    offloader = HostOffloader(pool)
    snapshot = offloader.offload([0, 2])
    for rings in pool.layers:
        rings.zero_([0, 2])
    offloader.restore(snapshot, slots=[2, 0])
    store = PrefixStore(dtype=torch.bfloat16)
    store.put("system-prompt", pool, slot=1)
    store.fetch_into("system-prompt", pool, slot=0)
    return {"pool": pool.layers, "snapshot": snapshot}


def build_compressed_offload_and_prefix_fetch() -> dict[str, object]:
    """A bf16-compressed host snapshot of an fp32 pool, and a prefix fetched as new caches."""
    torch.manual_seed(0)
    pool = randomize_(ReplayCachePool(TINY_REPLAY_SPEC, 2, 4, ring_dtypes=ring_dtypes_for("fp32")))
    snapshot = HostOffloader(pool, host_dtype=torch.bfloat16).offload([1])
    store = PrefixStore(dtype=torch.bfloat16)
    store.put("system-prompt", pool, slot=0)
    return {"snapshot": snapshot, "prefix": store.fetch("system-prompt"), "pool": pool.layers}
