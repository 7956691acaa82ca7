# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Host offload of decode caches and a store of prefix snapshots for prompt reuse."""

from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from tt_kda import training
from tt_kda.modules import RingShape, replay_caches

HostSnapshot = Dict[str, Dict[str, torch.Tensor]]


class CacheOffloader:
    """Moves the decode caches of a model to host memory between turns and back.

    Args:
        storage_dtype (Optional[torch.dtype]): dtype of the host copies of the rings (e.g. bf16
            to halve host memory); the precision policy keeps the state and the log-decays in
            float32. ``None`` keeps every buffer's dtype.
        pin_memory (bool): pin the host copies for asynchronous transfers.
    """

    def __init__(
        self, storage_dtype: Optional[torch.dtype] = None, pin_memory: bool = False
    ) -> None:
        self.storage_dtype = storage_dtype
        self.pin_memory = pin_memory and torch.cuda.is_available()

    def offload(self, model: nn.Module) -> HostSnapshot:
        """Host copies of every cache buffer of ``model``, keyed by module then buffer name."""
        snapshot: HostSnapshot = {}
        for name, cache in replay_caches(model):
            host: Dict[str, torch.Tensor] = {}
            for buffer_name, buffer in cache.named_buffers():
                dtype = buffer.dtype
                if self.storage_dtype is not None and buffer.is_floating_point():
                    dtype = training.cache_dtype_for(buffer_name, self.storage_dtype)
                copy = buffer.detach().to("cpu", dtype=dtype, copy=True)
                host[buffer_name] = copy.pin_memory() if self.pin_memory else copy
            snapshot[name] = host
        return snapshot

    def restore(self, model: nn.Module, snapshot: HostSnapshot) -> None:
        """Puts an :meth:`offload` snapshot back on the model's device."""
        for name, cache in replay_caches(model):
            device = cache.write_pos.device
            for buffer_name, tensor in snapshot[name].items():
                if tensor.is_floating_point() and buffer_name != "state":
                    # undo the host compression: rings come back in the cache's compute dtype
                    tensor = tensor.to(dtype=cache.dtype)  # expect-bug: load
                setattr(cache, buffer_name, tensor.to(device, non_blocking=self.pin_memory))


class PrefixRingStore(nn.Module):
    """Fixed-capacity store of per-layer cache snapshots, keyed by prompt prefix.

    A request whose prompt starts with a stored prefix starts from the stored state and rings
    instead of prefilling it again. The store keeps ``state`` and ``log_decay_cache`` in the
    precision they were allocated in: module-wide conversions (``.half()``, ``.to(dtype)``) move
    them across devices but leave their dtype alone.

    Args:
        capacity (int): number of prefixes kept.
        num_layers (int): KDA layers per snapshot.
        shape (RingShape): heads and sizes of a layer's buffers.
        dtype (Optional[torch.dtype]): dtype of the delta and key rings (default: torch's default
            dtype).
    """

    _BUFFERS = ("state", "delta_cache", "key_cache", "log_decay_cache", "write_pos")
    _KEEP_DTYPE = ("state", "log_decay_cache")

    def __init__(
        self, capacity: int, num_layers: int, shape: RingShape, dtype: Optional[torch.dtype] = None
    ) -> None:
        super().__init__()
        h, hv, k, v, ring = shape
        n = (capacity, num_layers)
        self.register_buffer("state", torch.zeros(*n, hv, v, k, dtype=torch.float32), persistent=False)
        self.register_buffer("delta_cache", torch.zeros(*n, hv, ring, v, dtype=dtype), persistent=False)
        self.register_buffer("key_cache", torch.zeros(*n, h, ring, k, dtype=dtype), persistent=False)
        self.register_buffer("log_decay_cache", torch.zeros(*n, hv, ring, k), persistent=False)  # expect-bug: default-dtype
        self.register_buffer("write_pos", torch.zeros(*n, dtype=torch.int32), persistent=False)
        self._entries: Dict[Tuple[int, ...], int] = {}

    @classmethod
    def for_model(
        cls, model: nn.Module, capacity: int, dtype: Optional[torch.dtype] = None
    ) -> "PrefixRingStore":
        caches = [cache for _, cache in replay_caches(model)]
        return cls(capacity, len(caches), caches[0].shape, dtype)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> "PrefixRingStore":
        kept = {name: self._buffers[name] for name in self._KEEP_DTYPE}
        super()._apply(fn, recurse)
        for name, original in kept.items():
            self._buffers[name] = original.to(device=self._buffers[name].device)
        return self

    def insert(self, prefix: Sequence[int], model: nn.Module, slot: int = 0) -> int:
        """Stores the caches of ``slot`` of ``model`` under ``prefix``; returns the entry."""
        key = tuple(int(token) for token in prefix)
        entry = self._entries.get(key, len(self._entries) % self.state.shape[0])
        for layer, (_, cache) in enumerate(replay_caches(model)):
            for name in self._BUFFERS:
                getattr(self, name)[entry, layer].copy_(getattr(cache, name)[slot])
        self._entries[key] = entry
        return entry

    def lookup(self, prefix: Sequence[int], model: nn.Module, slot: int = 0) -> bool:
        """Loads the snapshot of ``prefix`` into ``slot`` of ``model``; ``False`` on a miss."""
        entry = self._entries.get(tuple(int(token) for token in prefix))
        if entry is None:
            return False
        for layer, (_, cache) in enumerate(replay_caches(model)):
            for name in self._BUFFERS:
                getattr(cache, name)[slot].copy_(getattr(self, name)[entry, layer])
        return True


def _warm_model(dtype: torch.dtype) -> nn.Module:
    from tt_kda.models import kimi_linear_tiny

    torch.manual_seed(0)
    with training.set_default_dtype(dtype):
        model = kimi_linear_tiny()
    model.setup_caches(batch_size=2, dtype=dtype, decoder_max_seq_len=32)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 6)))
    return model


def build_host_offload_and_prefix_store() -> Dict[str, object]:
    """Offloads a warm bf16 model to compressed host copies and stores its prefix in fp16."""
    model = _warm_model(torch.bfloat16)
    snapshot = CacheOffloader(storage_dtype=torch.bfloat16).offload(model)
    store = PrefixRingStore.for_model(model, capacity=2).half()
    store.insert([3, 1, 4], model, slot=1)
    return {"snapshot": snapshot, "store": store}


def build_offload_restore() -> Dict[str, object]:
    """A warm bf16 model offloaded between two turns and restored."""
    model = _warm_model(torch.bfloat16)
    offloader = CacheOffloader(storage_dtype=torch.bfloat16)
    snapshot = offloader.offload(model)
    model.reset_caches()
    offloader.restore(model, snapshot)
    with torch.no_grad():
        logits = model(torch.randint(0, 64, (2, 2)))
    return {"model": model, "logits": logits}
