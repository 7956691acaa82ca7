# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Per-layer decode cache for Kimi Delta Attention in the ReplaySSM layout."""

from typing import Dict, Iterator, NamedTuple, Sequence, Tuple

import torch
from torch import nn


class RingShape(NamedTuple):
    """Head counts and sizes of the ReplaySSM buffers of one KDA layer."""

    num_heads: int
    num_v_heads: int
    head_dim: int
    v_head_dim: int
    ring_len: int

    def state(self, slots: int) -> Tuple[int, ...]:
        return (slots, self.num_v_heads, self.v_head_dim, self.head_dim)

    def delta(self, slots: int) -> Tuple[int, ...]:
        return (slots, self.num_v_heads, self.ring_len, self.v_head_dim)

    def key(self, slots: int) -> Tuple[int, ...]:
        return (slots, self.num_heads, self.ring_len, self.head_dim)

    def log_decay(self, slots: int) -> Tuple[int, ...]:
        return (slots, self.num_v_heads, self.ring_len, self.head_dim)


class ReplayRingCache(nn.Module):
    """Standalone ``nn.Module`` holding the decode cache of one KDA layer.

    Like :class:`torchtune.modules.KVCache`, the buffers are registered as non-persistent so
    they follow the module across devices but stay out of its state dict.

    Buffers:
        - ``state`` ``[b, HV, V, K]``: checkpoint of the recurrent state.
        - ``delta_cache`` ``[b, HV, L, V]``: ring of deltas, in the cache dtype.
        - ``key_cache`` ``[b, H, L, K]``: ring of keys, in the cache dtype.
        - ``log_decay_cache`` ``[b, HV, L, K]``: ring of per-step log-decays.
        - ``write_pos`` ``[b]`` (int32): next ring position of each slot.

    Args:
        batch_size (int): number of slots.
        shape (RingShape): heads and sizes.
        dtype (torch.dtype): dtype of the delta and key rings.
        log_decay_dtype (torch.dtype): dtype of the log-decay ring.
        state_dtype (torch.dtype): dtype of the state checkpoint.
    """

    def __init__(
        self,
        batch_size: int,
        shape: RingShape,
        dtype: torch.dtype,
        *,
        log_decay_dtype: torch.dtype = torch.float32,
        state_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.ring_len = shape.ring_len
        self.dtype = dtype
        self.register_buffer(
            "state", torch.zeros(shape.state(batch_size), dtype=state_dtype), persistent=False
        )
        self.register_buffer(
            "delta_cache", torch.zeros(shape.delta(batch_size), dtype=dtype), persistent=False
        )
        self.register_buffer(
            "key_cache", torch.zeros(shape.key(batch_size), dtype=dtype), persistent=False
        )
        self.register_buffer(
            "log_decay_cache",
            torch.zeros(shape.log_decay(batch_size), dtype=log_decay_dtype),
            persistent=False,
        )
        self.register_buffer(
            "write_pos", torch.zeros(batch_size, dtype=torch.int32), persistent=False
        )

    @property
    def batch_size(self) -> int:
        return self.write_pos.shape[0]

    def reset(self) -> None:
        """Clears every slot."""
        for buffer in self.buffers():
            buffer.zero_()

    def reset_slots(self, slots: Sequence[int]) -> None:
        """Clears the given slots, e.g. when their requests finish."""
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.write_pos.device)
        for buffer in (self.state, self.delta_cache, self.key_cache, self.write_pos):
            buffer.index_fill_(0, index, 0)
        cleared = torch.zeros_like(self.log_decay_cache[: index.numel()])
        self.log_decay_cache.index_copy_(0, index, cleared)

    def snapshot(self) -> Dict[str, torch.Tensor]:
        """Copies of every buffer, keyed by buffer name."""
        return {name: buffer.detach().clone() for name, buffer in self.named_buffers()}

    def restore(self, snapshot: Dict[str, torch.Tensor]) -> None:
        """Copies a :meth:`snapshot` back in place (each buffer keeps its dtype and device)."""
        for name, buffer in self.named_buffers():
            buffer.copy_(snapshot[name])

    def reorder(self, indices: torch.Tensor) -> None:
        """Reorders the slots, e.g. to follow the surviving beams of a beam search."""
        for name, buffer in list(self.named_buffers()):
            setattr(self, name, buffer.index_select(0, indices))

    def grow(self, batch_size: int) -> None:
        """Adds empty slots at the end so the cache holds ``batch_size`` of them."""
        old = self.batch_size
        if batch_size <= old:
            return
        state = self.state.new_zeros((batch_size, *self.state.shape[1:]))
        delta = self.delta_cache.new_zeros((batch_size, *self.delta_cache.shape[1:]))
        keys = self.key_cache.new_zeros((batch_size, *self.key_cache.shape[1:]))
        log_decay = delta.new_zeros((batch_size, *self.log_decay_cache.shape[1:]))  # expect-bug: like
        write_pos = self.write_pos.new_zeros(batch_size)
        state[:old] = self.state
        delta[:old] = self.delta_cache
        keys[:old] = self.key_cache
        log_decay[:old] = self.log_decay_cache
        write_pos[:old] = self.write_pos
        self.state, self.delta_cache, self.key_cache = state, delta, keys
        self.log_decay_cache, self.write_pos = log_decay, write_pos


def replay_caches(model: nn.Module) -> Iterator[Tuple[str, ReplayRingCache]]:
    """``(module name, cache)`` for every :class:`ReplayRingCache` of ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, ReplayRingCache):
            yield name, module


def get_cache_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Copies of every decode-cache buffer of ``model``, keyed ``{module}.{buffer}``."""
    return {
        f"{name}.{buffer_name}": buffer.detach().clone()
        for name, cache in replay_caches(model)
        for buffer_name, buffer in cache.named_buffers()
    }


def load_cache_state(model: nn.Module, cache_state: Dict[str, torch.Tensor]) -> None:
    """Copies a :func:`get_cache_state` result into ``model``'s caches, keeping their dtypes."""
    for name, cache in replay_caches(model):
        for buffer_name, buffer in cache.named_buffers():
            buffer.copy_(cache_state[f"{name}.{buffer_name}"])


def _filled_cache(dtype: torch.dtype, batch_size: int) -> ReplayRingCache:
    from tt_kda.training.precision import set_default_dtype

    torch.manual_seed(0)
    with set_default_dtype(dtype):
        cache = ReplayRingCache(batch_size, RingShape(2, 4, 8, 8, ring_len=4), dtype=dtype)
    cache.delta_cache.normal_()
    cache.key_cache.normal_()
    cache.log_decay_cache.uniform_(-0.5, 0.0)
    cache.state.normal_()
    cache.write_pos.fill_(3)
    return cache


def build_replay_cache_bf16() -> Dict[str, object]:
    """A bf16 cache created under a bf16 default dtype, snapshotted, reordered and restored."""
    cache = _filled_cache(torch.bfloat16, batch_size=3)
    snapshot = cache.snapshot()
    cache.reorder(torch.tensor([2, 0, 1]))
    cache.reset_slots([1])
    cache.restore(snapshot)
    return {"cache": cache, "snapshot": snapshot}


def build_grown_cache() -> Dict[str, object]:
    """A bf16 cache grown from two to four slots."""
    cache = _filled_cache(torch.bfloat16, batch_size=2)
    cache.grow(4)
    return {"cache": cache}
