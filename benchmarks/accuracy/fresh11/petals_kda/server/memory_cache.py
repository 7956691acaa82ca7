"""A cache for the session tensors of every block a server runs (``petals.server.memory_cache`` without the
bookkeeping shared between connection handlers and the runtime process)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from ..block import GATE_CACHE_DTYPE, KDAConfig
from ..hivemind_compat import TensorDescriptor

Handle = int


class AllocationFailed(Exception):
    pass


def _descr_size(descr: TensorDescriptor) -> int:
    return descr.numel() * torch.empty((), dtype=descr.dtype).element_size()


class MemoryCache:
    """Allocates session tensors within a byte budget; they are looked up by handle."""

    def __init__(self, max_size_bytes: Optional[int] = None, cache_dtype: Optional[torch.dtype] = None):
        self.max_size_bytes = max_size_bytes if max_size_bytes is not None else 2**63 - 1
        self.cache_dtype = cache_dtype  # --cache_dtype: keep session caches in another dtype than the blocks
        self._current_size = self._handle_counter = 0
        self._allocated_tensors: dict[Handle, torch.Tensor] = {}
        self._descriptors: dict[Handle, TensorDescriptor] = {}

    @property
    def current_size_bytes(self) -> int:
        return self._current_size

    def _make_tensor(self, descr: TensorDescriptor) -> torch.Tensor:
        if self.cache_dtype is not None and descr.dtype is not None and descr.dtype.is_floating_point:
            return descr.make_zeros(dtype=self.cache_dtype)  # expect-bug: pool-dtype
        return descr.make_zeros()

    @contextlib.contextmanager
    def allocate_cache(self, *descriptors: TensorDescriptor) -> Iterator[Sequence[Handle]]:
        """Zeroed tensors for ``descriptors``: yields their handles and frees them on exit."""
        size = sum(map(_descr_size, descriptors))
        if self._current_size + size > self.max_size_bytes:
            raise AllocationFailed(f"Could not allocate {size} bytes, {self.max_size_bytes - self._current_size} left")
        handles = tuple(range(self._handle_counter, self._handle_counter + len(descriptors)))
        self._handle_counter += len(descriptors)
        self._current_size += size
        for handle, descr in zip(handles, descriptors):
            self._descriptors[handle], self._allocated_tensors[handle] = descr, self._make_tensor(descr)
        try:
            yield handles
        finally:
            for handle in handles:
                self._allocated_tensors.pop(handle, None)
                self._descriptors.pop(handle)
            self._current_size -= size

    @contextlib.contextmanager
    def use_cache(self, *handles: Handle) -> Iterator[Sequence[torch.Tensor]]:
        yield tuple(self._allocated_tensors[handle] for handle in handles)

    def snapshot(self, handles: Sequence[Handle], path: str) -> None:
        """Saves a client's tensors as they are, for ``rollback`` (``start_from_position``)."""
        torch.save({handle: self._allocated_tensors[handle].clone() for handle in handles}, path)

    def rollback(self, handles: Sequence[Handle], path: str) -> None:
        saved = torch.load(path)
        for handle in handles:
            self._allocated_tensors[handle].copy_(saved[handle])

    def offload(self, handles: Sequence[Handle], path: str) -> None:
        """Parks an idle session on disk (floating tensors in half precision) and frees its memory."""
        arrays = {}
        for handle in handles:
            tensor = self._allocated_tensors.pop(handle).detach().cpu()
            array = tensor.float().numpy().astype(np.float16) if tensor.is_floating_point() else tensor.numpy()
            arrays[f"h{handle}"] = array
            self._current_size -= _descr_size(self._descriptors[handle])
        np.savez(path, **arrays)

    def reload(self, handles: Sequence[Handle], path: str) -> None:
        with np.load(path) as archive:
            for handle in handles:
                self._allocated_tensors[handle] = torch.from_numpy(archive[f"h{handle}"])  # expect-bug: load
                self._current_size += _descr_size(self._descriptors[handle])


CACHE_NAMES = ("delta_cache", "key_cache", "log_gate_cache", "ssm_state", "positions")


def session_descriptors(config: KDAConfig, batch_size: int, dtype: torch.dtype) -> tuple[TensorDescriptor, ...]:
    shapes = config.ring_shapes(batch_size)
    return (TensorDescriptor(shapes["delta"], dtype=dtype), TensorDescriptor(shapes["key"], dtype=dtype),
            TensorDescriptor(shapes["log_gate"], dtype=GATE_CACHE_DTYPE),
            TensorDescriptor(config.state_shape(batch_size), dtype=torch.float32),
            TensorDescriptor((batch_size,), dtype=torch.int32))


def _fill(tensors: Sequence[torch.Tensor], value: float) -> None:
    for tensor in tensors[:4]:
        tensor.fill_(value)
    tensors[4].fill_(3)


def build_cache_pool(tmp_dir: str) -> dict:
    """A bf16 and an fp16 session; the first rolled back to a snapshot after one more step."""
    cache, config = MemoryCache(max_size_bytes=1 << 20), KDAConfig()
    with cache.allocate_cache(*session_descriptors(config, 2, torch.bfloat16)) as bf16_handles, \
            cache.allocate_cache(*session_descriptors(config, 1, torch.float16)) as fp16_handles:
        with cache.use_cache(*bf16_handles) as bf16, cache.use_cache(*fp16_handles) as fp16:
            _fill(bf16, -0.5)
            _fill(fp16, -0.25)
            cache.snapshot(bf16_handles, os.path.join(tmp_dir, "session.pt"))
            _fill(bf16, -1.0)
            cache.rollback(bf16_handles, os.path.join(tmp_dir, "session.pt"))
            return {"bf16": dict(zip(CACHE_NAMES, bf16)), "fp16": dict(zip(CACHE_NAMES, fp16)),
                    "used_bytes": torch.tensor(cache.current_size_bytes)}


def build_offloaded_pool(tmp_dir: str) -> dict:
    """A session of a ``--cache_dtype float16`` server, and a bf16 session offloaded while idle and reloaded."""
    config = KDAConfig()
    compact, cache = MemoryCache(cache_dtype=torch.float16), MemoryCache()
    with compact.allocate_cache(*session_descriptors(config, 1, torch.bfloat16)) as compact_handles, \
            cache.allocate_cache(*session_descriptors(config, 1, torch.bfloat16)) as handles:
        with compact.use_cache(*compact_handles) as compact_tensors, cache.use_cache(*handles) as before:
            _fill(compact_tensors, -0.5)
            _fill(before, -0.125)
        path = os.path.join(tmp_dir, "idle.npz")
        cache.offload(handles, path)
        cache.reload(handles, path)
        with cache.use_cache(*handles) as reloaded:
            return {"compact": dict(zip(CACHE_NAMES, compact_tensors)), "reloaded": dict(zip(CACHE_NAMES, reloaded))}
