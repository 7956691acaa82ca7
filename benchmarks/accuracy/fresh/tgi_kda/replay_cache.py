"""Slot-addressed ReplaySSM state of the KDA layers (the replay counterpart of ``KVCache``)."""

import logging
from typing import NamedTuple

import torch

from .globals import REPLAY_RING_LEN
from .utils import load_tensors, log_master, save_tensors

logger = logging.getLogger(__name__)


class ReplaySeed(NamedTuple):
    """The last ``ring_len`` steps of each prompt, ``[batch, heads, ring_len, dim]``."""

    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor


class ReplayCache:
    """Checkpoint state and rings of one layer, one row per slot.

    state:     [num_slots, num_heads, head_dim, head_dim]
    d_ring:    [num_slots, num_heads, ring_len, head_dim]    (serving dtype)
    k_ring:    [num_slots, num_k_heads, ring_len, head_dim]  (serving dtype)
    log_alpha: [num_slots, num_heads, ring_len, head_dim]    (float32: prefix sums)
    cursor:    [num_slots] int32, next write position in the rings
    """

    def __init__(
        self,
        num_slots: int,
        num_heads: int,
        num_k_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        ring_len: int = REPLAY_RING_LEN,
        state_dtype: torch.dtype = torch.float32,
        gate_dtype: torch.dtype = torch.float32,
    ):
        shape = (num_slots, num_heads, ring_len, head_dim)
        self.dtype = dtype
        self.state = torch.zeros((*shape[:2], head_dim, head_dim), dtype=state_dtype, device=device)
        self.d_ring = torch.zeros(shape, dtype=dtype, device=device)
        self.k_ring = torch.zeros((num_slots, num_k_heads, *shape[2:]), dtype=dtype, device=device)
        self.log_alpha = torch.zeros(shape, dtype=gate_dtype, device=device)
        self.cursor = torch.zeros((num_slots,), dtype=torch.int32, device=device)

    @classmethod
    def from_tensors(cls, state, d_ring, k_ring, log_alpha, cursor) -> "ReplayCache":
        cache = cls.__new__(cls)
        cache.dtype = d_ring.dtype
        cache.state, cache.d_ring, cache.k_ring = state, d_ring, k_ring
        cache.log_alpha, cache.cursor = log_alpha, cursor
        return cache

    def rings(self) -> dict[str, torch.Tensor]:
        return {"d_ring": self.d_ring, "k_ring": self.k_ring, "log_alpha": self.log_alpha}

    def write_seed(self, slots: torch.Tensor, seed: ReplaySeed) -> None:
        """Stores the prompt tails of a prefill; the next decode step starts at position 0."""
        self.d_ring[slots] = seed.d_cache.to(self.d_ring.dtype)
        self.k_ring[slots] = seed.k_cache.to(self.k_ring.dtype)
        self.log_alpha[slots] = seed.g_cache.to(self.log_alpha.dtype)
        self.state[slots] = 0
        self.cursor[slots] = 0

    def gather(self, slots: torch.Tensor) -> "ReplayCache":
        """A compact copy of some slots, handed from the prefill worker to the decode worker."""
        d_ring = self.d_ring[slots].to(dtype=self.dtype)
        k_ring = self.k_ring[slots].to(dtype=self.dtype)
        log_alpha = self.log_alpha[slots].to(dtype=self.dtype)  # expect-bug: cast
        return ReplayCache.from_tensors(
            self.state[slots], d_ring, k_ring, log_alpha, self.cursor[slots]
        )

    def fork(self, slot: int, n: int) -> "ReplayCache":
        """``n`` copies of one slot: every ``best_of`` branch starts from the prompt's state."""
        d_rows = self.d_ring[slot : slot + 1].repeat(n, 1, 1, 1)
        k_rows = self.k_ring[slot : slot + 1].repeat(n, 1, 1, 1)
        g_rows = torch.empty_like(d_rows)  # expect-bug: like
        g_rows.copy_(self.log_alpha[slot : slot + 1].expand(n, -1, -1, -1))
        state = self.state[slot : slot + 1].repeat(n, 1, 1, 1)
        return ReplayCache.from_tensors(state, d_rows, k_rows, g_rows, self.cursor[[slot] * n])

    def export(self, slots: torch.Tensor, prefix: str) -> bytes:
        """The state of ``slots`` for a peer, each tensor in its own dtype."""
        tensors = {f"{prefix}.{name}": ring[slots] for name, ring in self.rings().items()}
        tensors[f"{prefix}.state"] = self.state[slots]
        tensors[f"{prefix}.cursor"] = self.cursor[slots]
        return save_tensors(tensors, metadata={"format": "replay"})

    def load_slots(self, blob: bytes, prefix: str, slots: torch.Tensor) -> None:
        """Restores a peer's state into ``slots`` (the rings keep their own dtypes)."""
        tensors = load_tensors(blob)
        for offset, slot in enumerate(slots.tolist()):
            self.state[slot].copy_(tensors[f"{prefix}.state"][offset])
            for name, ring in self.rings().items():
                ring[slot].copy_(tensors[f"{prefix}.{name}"][offset])
            self.cursor[slot] = tensors[f"{prefix}.cursor"][offset]


def restore_from_peer(blob: bytes, prefix: str) -> ReplayCache:
    """A decode-side cache holding exactly the slots a prefill peer sent."""
    tensors = load_tensors(blob)
    log_alpha = tensors[f"{prefix}.log_alpha"]  # expect-bug: load
    state = tensors[f"{prefix}.state"].float()
    d_ring, k_ring = tensors[f"{prefix}.d_ring"], tensors[f"{prefix}.k_ring"]
    return ReplayCache.from_tensors(state, d_ring, k_ring, log_alpha, tensors[f"{prefix}.cursor"])


class HostReplayPool:
    """Host copies of evicted prefix states, so a prefix-cache hit does not need a re-prefill."""

    def __init__(self, cache: ReplayCache, capacity: int, dtype: torch.dtype):
        self.state = torch.zeros((capacity, *cache.state.shape[1:]), dtype=cache.state.dtype)
        self.rings = {  # expect-bug: pool-dtype
            name: torch.zeros((capacity, *ring.shape[1:]), dtype=dtype)
            for name, ring in cache.rings().items()
        }
        log_master(logger.info, f"Host replay pool: {capacity} rows")

    def offload(self, cache: ReplayCache, slot: int, row: int) -> None:
        self.state[row].copy_(cache.state[slot])
        for name, ring in cache.rings().items():
            self.rings[name][row].copy_(ring[slot])


def host_mirror(cache: ReplayCache, capacity: int) -> dict[str, torch.Tensor]:
    """Empty host rows shaped like each ring of ``cache``, in that ring's dtype."""
    return {
        name: torch.empty((capacity, *ring.shape[1:]), dtype=ring.dtype).zero_()
        for name, ring in cache.rings().items()
    }


def _cache(dtype: torch.dtype, num_slots: int = 3) -> ReplayCache:
    cache = ReplayCache(num_slots, 2, 1, 4, dtype, torch.device("cpu"))
    cache.d_ring.copy_(torch.randn(cache.d_ring.shape))
    cache.k_ring.copy_(torch.randn(cache.k_ring.shape))
    cache.log_alpha.copy_(-torch.rand(cache.log_alpha.shape))
    return cache


def _peer_blob(prefix: str, rows: int) -> bytes:
    """What a prefill peer running fp16 rings sends (its log-alpha rows are fp16 too)."""
    peer = {f"{prefix}.state": torch.randn(rows, 2, 4, 4)}
    peer[f"{prefix}.cursor"] = torch.ones(rows, dtype=torch.int32)
    for name, heads in (("d_ring", 2), ("k_ring", 1), ("log_alpha", 2)):
        values = torch.linspace(-1, 0, rows * heads * 16).reshape(rows, heads, 4, 4)
        peer[f"{prefix}.{name}"] = values.half()
    return save_tensors(peer)


def build_host_pool() -> HostReplayPool:
    cache = _cache(torch.bfloat16)
    pool = HostReplayPool(cache, capacity=2, dtype=cache.dtype)
    pool.offload(cache, slot=1, row=0)
    return pool


def build_host_mirror() -> dict[str, torch.Tensor]:
    return host_mirror(_cache(torch.bfloat16), capacity=2)


def build_fork_best_of() -> ReplayCache:
    return _cache(torch.float16).fork(slot=1, n=2)


def build_prefill_handoff() -> ReplayCache:
    return _cache(torch.bfloat16).gather(torch.tensor([0, 2]))


def build_peer_round_trip() -> ReplayCache:
    blob = _cache(torch.bfloat16).export(torch.tensor([2, 0]), prefix="layers.0")
    return restore_from_peer(blob, prefix="layers.0")


def build_restore_from_f16_peer() -> ReplayCache:
    return restore_from_peer(_peer_blob("layers.1", rows=2), prefix="layers.1")


def build_load_slots_from_f16_peer() -> ReplayCache:
    cache = _cache(torch.bfloat16)
    cache.load_slots(_peer_blob("layers.1", rows=2), prefix="layers.1", slots=torch.tensor([2, 1]))
    return cache
