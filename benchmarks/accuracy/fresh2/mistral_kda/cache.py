"""The ReplaySSM cache: for every local layer and sequence slot, a float32 state checkpoint and
three rings of the last ``replay_len`` steps (the deltas, the keys, and the gate's log-decays,
which the kernel prefix-sums and exponentiates)."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .args import TransformerArgs

RING_NAMES = ("cache_state", "cache_delta", "cache_key", "cache_gate")


@dataclass
class CacheInputMetadata:
    seqlens: List[int]  # the sequences, one after the other in the flattened tokens
    prefill: bool  # some sequence has more than one token (a prompt chunk)
    slot_indices: torch.Tensor  # int32, one per sequence


@dataclass
class ReplayCacheView:
    """One layer's part of a cache."""

    state: torch.Tensor  # [B, HV, V, K]
    delta: torch.Tensor  # [B, HV, L, V]
    gate: torch.Tensor  # [B, HV, L, K]
    key: torch.Tensor  # [B, H, L, K]
    write_pos: torch.Tensor  # [B]
    metadata: CacheInputMetadata

    @property
    def rings(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rings in storage order: the two indexed by the value heads, then the key ring."""
        return self.delta, self.gate, self.key


class _ViewsMixin:
    """Views and metadata, for BufferCache and StaticReplayCache."""

    @property
    def device(self) -> torch.device:
        return self.cache_delta.device

    def reset(self) -> None:
        self.seqlens = None
        for t in (self.cache_state, self.cache_delta, self.cache_key, self.cache_gate, self.write_pos):
            t.zero_()

    def update_seqlens(self, seqlens: List[int]) -> None:
        assert self.seqlens is not None
        self.seqlens = [n + s for n, s in zip(self.seqlens, seqlens)]

    def get_input_metadata(self, seqlens: List[int]) -> CacheInputMetadata:
        if self.seqlens is None:
            self.seqlens = [0] * len(seqlens)
        assert len(seqlens) == len(self.seqlens), (
            f"Batch size is {len(self.seqlens)}, got {len(seqlens)}, did you forget to reset cache?")
        return CacheInputMetadata(
            seqlens=list(seqlens), prefill=max(seqlens) > 1,
            slot_indices=torch.arange(len(seqlens), dtype=torch.int32, device=self.device))

    def get_view(self, layer_id: int, metadata: CacheInputMetadata) -> ReplayCacheView:
        return ReplayCacheView(self.cache_state[layer_id], self.cache_delta[layer_id], self.cache_gate[layer_id],
                               self.cache_key[layer_id], self.write_pos[layer_id], metadata)


class BufferCache(_ViewsMixin):
    """Allocated on the host (float32), then moved with ``to(device, dtype)``."""

    # rings that keep their dtype in ``to()``
    ring_dtypes: Dict[str, torch.dtype] = {"cache_state": torch.float32, "cache_gate": torch.float32}

    def __init__(self, n_layers: int, max_batch_size: int, n_heads: int, n_v_heads: int, head_k_dim: int,
                 head_v_dim: int, replay_len: int) -> None:
        self.n_layers, self.max_batch_size, self.replay_len = n_layers, max_batch_size, replay_len
        self.cache_state = torch.zeros((n_layers, max_batch_size, n_v_heads, head_v_dim, head_k_dim), dtype=torch.float32)
        self.cache_delta = torch.zeros((n_layers, max_batch_size, n_v_heads, replay_len, head_v_dim))
        self.cache_key = torch.zeros((n_layers, max_batch_size, n_heads, replay_len, head_k_dim))
        self.cache_gate = torch.zeros((n_layers, max_batch_size, n_v_heads, replay_len, head_k_dim))  # expect-bug: default-dtype id=in-place
        self.write_pos = torch.zeros((n_layers, max_batch_size), dtype=torch.int32)
        self.seqlens: Optional[List[int]] = None

    def to(self, device: torch.device, dtype: torch.dtype) -> "BufferCache":
        for name in RING_NAMES:
            setattr(self, name, getattr(self, name).to(device=device, dtype=self.ring_dtypes.get(name, dtype)))
        self.write_pos = self.write_pos.to(device=device)
        return self


class HostBufferCache(BufferCache):
    """A BufferCache parked in host memory between two turns of a chat. The rings are staged in the
    model dtype, which halves the host memory; the state checkpoint stays float32."""

    ring_dtypes = {"cache_state": torch.float32}  # expect-bug: container

    @classmethod
    def park(cls, cache: BufferCache, dtype: torch.dtype) -> "HostBufferCache":
        host = cls.__new__(cls)
        host.__dict__.update(cache.__dict__)
        return host.to(device=torch.device("cpu"), dtype=dtype)

    def unpark(self, device: torch.device, dtype: torch.dtype) -> BufferCache:
        cache = BufferCache.__new__(BufferCache)
        cache.__dict__.update(self.__dict__)
        return cache.to(device=device, dtype=dtype)


class StaticReplayCache(_ViewsMixin, nn.Module):
    """The same rings as buffers of the model (``Transformer.setup_static_cache``): fixed addresses
    for CUDA-graph decoding, moved with the model."""

    def __init__(self, args: TransformerArgs, n_layers: int, max_batch_size: int, ring_dtype: torch.dtype,
                 gate_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        kda, shape = args.kda, (n_layers, max_batch_size)
        L, H, HV, K, V = kda.replay_len, kda.num_heads, kda.num_v_heads, kda.head_k_dim, kda.head_v_dim
        self.register_buffer("cache_state", torch.zeros(*shape, HV, V, K, dtype=torch.float32), persistent=False)
        self.register_buffer("cache_delta", torch.zeros(*shape, HV, L, V, dtype=ring_dtype), persistent=False)
        self.register_buffer("cache_key", torch.zeros(*shape, H, L, K, dtype=ring_dtype), persistent=False)
        self.register_buffer("cache_gate", torch.zeros(*shape, HV, L, K, dtype=gate_dtype), persistent=False)
        self.register_buffer("write_pos", torch.zeros(*shape, dtype=torch.int32), persistent=False)
        self.seqlens = None


def build_buffer_cache():
    return BufferCache(2, 2, 2, 2, 8, 8, 4).to(device=torch.device("cpu"), dtype=torch.bfloat16)


def build_park_session():
    cache = BufferCache(2, 2, 2, 2, 8, 8, 4).to(device=torch.device("cpu"), dtype=torch.bfloat16)
    cache.cache_gate.copy_(-torch.rand(cache.cache_gate.shape))
    host = HostBufferCache.park(cache, dtype=torch.bfloat16)
    return {"host": host, "cache": host.unpark(torch.device("cpu"), torch.bfloat16)}
