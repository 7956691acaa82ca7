"""ReplaySSM ring caches for batched and beam-search decoding.

A KDA layer's decode state is a float32 checkpoint per slot plus three rings written since the
last fold: delta rows, key rows (both activations, stored like the model's activations) and
log forget gates (float32: the kernel takes prefix sums of them and exponentiates). `RingArgs`
names one layer's tensors the way the decode kernel takes them, so a layer can pass them
straight through; `ReplayRingCache` owns them as module buffers for a fixed number of slots.
"""

from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from . import utils

if TYPE_CHECKING:
    from .model import ModelDimensions

RING_NAMES = ("delta_cache", "key_cache", "forget_cache")
FLOAT32_BUFFERS = ("ssm_state", "forget_cache")


class RingArgs(NamedTuple):
    """One decoder layer's ReplaySSM tensors, under the decode kernel's argument names."""

    initial_state: Tensor
    d_cache: Tensor
    k_cache: Tensor
    g_cache: Tensor
    write_pos: Tensor
    ssm_state_indices: Tensor

    @property
    def n_rows(self) -> int:
        return self.ssm_state_indices.shape[0]

    def rows(self, start: int, count: int) -> "RingArgs":
        """Rows ``start:start+count`` (views), renumbered from 0."""
        end = start + count
        return RingArgs(
            self.initial_state[start:end],
            self.d_cache[start:end],
            self.k_cache[start:end],
            self.g_cache[start:end],
            self.write_pos[start:end],
            torch.arange(count, dtype=torch.int32, device=self.ssm_state_indices.device),
        )


class LayerRings(nn.Module):
    """The buffers of one layer for ``n_slots`` slots.

    Module casts (``.half()``, ``.to(dtype)``) reach the delta and key rings only: the
    checkpoint state and the forget ring keep float32 through them.
    """

    def __init__(self, shapes: Dict[str, Tuple[int, ...]], dtypes: Dict[str, torch.dtype], device=None):
        super().__init__()
        n_slots = shapes["state"][0]
        self.register_buffer("ssm_state", torch.zeros(shapes["state"], dtype=dtypes["ssm_state"], device=device))
        self.register_buffer("delta_cache", torch.zeros(shapes["delta"], dtype=dtypes["delta_cache"], device=device))
        self.register_buffer("key_cache", torch.zeros(shapes["key"], dtype=dtypes["key_cache"], device=device))
        self.register_buffer("forget_cache", torch.zeros(shapes["forget"], dtype=dtypes["forget_cache"], device=device))
        self.register_buffer("write_pos", torch.zeros(n_slots, dtype=torch.int32, device=device))

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in FLOAT32_BUFFERS}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after is not None and after.dtype != before.dtype:
                self._buffers[name] = before.to(device=after.device)
        return self

    def kernel_args(self, n_rows: Optional[int] = None) -> RingArgs:
        n_rows = self.write_pos.shape[0] if n_rows is None else n_rows
        return RingArgs(
            self.ssm_state[:n_rows],
            self.delta_cache[:n_rows],
            self.key_cache[:n_rows],
            self.forget_cache[:n_rows],
            self.write_pos[:n_rows],
            torch.arange(n_rows, dtype=torch.int32, device=self.write_pos.device),
        )


class ReplayRingCache(nn.Module):
    """The rings of every decoder layer for ``n_slots`` sequences."""

    def __init__(
        self,
        dims: "ModelDimensions",
        n_slots: int,
        dtype: torch.dtype = torch.float32,
        device: Optional[Union[str, torch.device]] = None,
        dtypes: Optional[Dict[str, torch.dtype]] = None,
    ):
        super().__init__()
        self.dims = dims
        self.n_slots = n_slots
        dtypes = dtypes or utils.ring_dtypes(dtype)
        shapes = dims.ring_shapes(n_slots)
        self.layers = nn.ModuleList(LayerRings(shapes, dtypes, device) for _ in range(dims.n_text_layer))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the activation rings."""
        return self.layers[0].delta_cache.dtype

    def kernel_args(self, n_rows: Optional[int] = None) -> List[RingArgs]:
        return [layer.kernel_args(n_rows) for layer in self.layers]

    def reset(self) -> None:
        for buffer in self.buffers():
            buffer.zero_()

    def resize(self, n_slots: int) -> None:
        """Grows or shrinks every layer to ``n_slots`` slots; the first slots keep their contents."""
        keep = min(n_slots, self.n_slots)
        for layer in self.layers:
            state = torch.zeros((n_slots, *layer.ssm_state.shape[1:]), dtype=torch.float32, device=layer.ssm_state.device)
            state[:keep] = layer.ssm_state[:keep]
            layer.ssm_state = state
            for name in RING_NAMES:
                old = getattr(layer, name)
                new = torch.zeros((n_slots, *old.shape[1:]), dtype=self.dtype, device=old.device)  # expect-bug: pool-dtype
                new[:keep] = old[:keep]
                setattr(layer, name, new)
            write_pos = torch.zeros(n_slots, dtype=torch.int32, device=layer.write_pos.device)
            write_pos[:keep] = layer.write_pos[:keep]
            layer.write_pos = write_pos
        self.n_slots = n_slots

    def copy_slot(self, source: int, target: int) -> None:
        """Makes slot ``target`` continue from slot ``source`` (best-of-n restarts)."""
        for layer in self.layers:
            for buffer in layer.buffers():
                buffer[target].copy_(buffer[source])

    def fork(self, source_slots: Tensor) -> List[RingArgs]:
        """Copies of the rings of ``source_slots``, one row each, to decode alternatives from
        without touching this cache (n-best rescoring, prompt variants)."""
        index = source_slots.long()
        n_rows = index.numel()
        forks = []
        for layer in self.layers:
            state = layer.ssm_state.new_empty((n_rows, *layer.ssm_state.shape[1:]))
            delta = layer.delta_cache.new_empty((n_rows, *layer.delta_cache.shape[1:]))
            key = layer.key_cache.new_empty((n_rows, *layer.key_cache.shape[1:]))
            forget = torch.empty_like(delta)  # expect-bug: like
            for target, source in ((state, layer.ssm_state), (delta, layer.delta_cache), (key, layer.key_cache), (forget, layer.forget_cache)):
                target.copy_(source.index_select(0, index))
            write_pos = layer.write_pos.index_select(0, index)
            forks.append(RingArgs(state, delta, key, forget, write_pos, torch.arange(n_rows, dtype=torch.int32)))
        return forks

    # --- swapping a paused batch out to disk -------------------------------------------------

    def swap_out(self, path) -> None:
        """Writes the cache to ``path``; the rings in the cache dtype, states and cursors exactly."""
        tensors = {"n_slots": torch.tensor(self.n_slots)}
        for name, buffer in self.named_buffers():
            exact = name.endswith(("ssm_state", "write_pos"))
            tensors[name] = buffer if exact else buffer.to(self.dtype)  # expect-bug: load id=ring-swap
        torch.save(tensors, path)

    def swap_in_place(self, path) -> None:
        """Reads a cache written by `swap_out` back into this (already allocated) cache."""
        tensors = torch.load(path, map_location=self.layers[0].write_pos.device, weights_only=True)
        if int(tensors.pop("n_slots")) != self.n_slots:
            raise ValueError("the swapped-out cache has another number of slots")
        self.load_state_dict(tensors)

    @classmethod
    def swap_in(cls, dims: "ModelDimensions", path, device="cpu") -> "ReplayRingCache":
        """A new cache from a file written by `swap_out`, without allocating it twice."""
        tensors = torch.load(path, map_location=device, weights_only=True, mmap=True)
        n_slots = int(tensors.pop("n_slots"))
        with torch.device("meta"):
            cache = cls(dims, n_slots)
        cache.load_state_dict(tensors, assign=True)  # expect-bug: load id=ring-swap
        return cache


def _debug_cache(dtype: torch.dtype, n_slots: int = 3) -> ReplayRingCache:
    from .model import DEBUG_DIMS, ModelDimensions

    torch.manual_seed(0)
    cache = ReplayRingCache(ModelDimensions(**DEBUG_DIMS), n_slots, dtype=dtype)
    for buffer in cache.buffers():
        if buffer.is_floating_point():
            buffer.copy_(torch.randn(buffer.shape))
        else:
            buffer.copy_(torch.arange(buffer.numel(), dtype=buffer.dtype).reshape(buffer.shape) % 3)
    return cache


def build_ring_cache_half() -> Dict[str, ReplayRingCache]:
    """A float32 cache cast with .half() and one with .to(torch.bfloat16): only the activation rings change."""
    return {"half": _debug_cache(torch.float32).half(), "bf16": _debug_cache(torch.float32).to(torch.bfloat16)}


def build_resized_cache() -> ReplayRingCache:
    """A float16 cache grown from 3 to 5 slots."""
    cache = _debug_cache(torch.float16)
    cache.resize(5)
    return cache


def build_forked_slots() -> List[RingArgs]:
    """Forks of slots 2 and 0 of a bfloat16 cache."""
    cache = _debug_cache(torch.bfloat16)
    return cache.fork(torch.tensor([2, 0]))


def build_swapped_cache() -> Dict[str, ReplayRingCache]:
    """A float16 cache swapped out to disk and back in, once into a fresh cache, once in place."""
    import os
    import tempfile

    cache = _debug_cache(torch.float16)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch0.rings")
        cache.swap_out(path)
        fresh = ReplayRingCache.swap_in(cache.dims, path)
        in_place = _debug_cache(torch.float16)
        in_place.swap_in_place(path)
        # the swapped-in buffers map the file: copy them before it goes
        swapped_in = {name: buffer.clone() for name, buffer in fresh.named_buffers()}
    return {"swapped_in": swapped_in, "in_place": in_place}
