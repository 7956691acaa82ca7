"""KV caches of the attention layers and ReplaySSM state of the KDA layers: an fp32 checkpoint
per sequence plus rings of the steps since it (deltas, keys, log-decays)."""
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from .args import KDAArgs, TransformerArgs


@dataclass
class CacheInputMetadata:
    # rope absolute positions
    positions: torch.Tensor
    # where each sequence's new tokens go in the cache
    start: List[int]
    seqlens: List[int]
    # row of each sequence in the KDA tensors
    slot_ids: torch.Tensor
    prefill: bool


class CacheView:
    def __init__(self, cache_k: torch.Tensor, cache_v: torch.Tensor, metadata: CacheInputMetadata):
        self.cache_k, self.cache_v, self.metadata = cache_k, cache_v, metadata

    def update(self, xk: torch.Tensor, xv: torch.Tensor) -> None:
        offset = 0
        for i, (start, n) in enumerate(zip(self.metadata.start, self.metadata.seqlens)):
            self.cache_k[i, start : start + n] = xk[offset : offset + n]
            self.cache_v[i, start : start + n] = xv[offset : offset + n]
            offset += n

    def key_value(self, i: int):
        end = self.metadata.start[i] + self.metadata.seqlens[i]
        return self.cache_k[i, :end], self.cache_v[i, :end]


class KDACacheView:
    def __init__(self, state, cache_delta, cache_key, cache_decay, write_pos, metadata: CacheInputMetadata):
        self.state, self.cache_delta, self.cache_key, self.cache_decay = state, cache_delta, cache_key, cache_decay
        self.write_pos, self.metadata = write_pos, metadata

    def ring_kwargs(self) -> Dict[str, torch.Tensor]:
        """The arguments of ``ops.kda.fused_recurrent_kda_replayssm_decode`` this view provides."""
        return dict(initial_state=self.state, d_cache=self.cache_delta, k_cache=self.cache_key, g_cache=self.cache_decay,
                    ssm_state_indices=self.metadata.slot_ids, write_pos=self.write_pos)


class BufferCache:
    """Caches of ``max_batch_size`` sequences; allocated like the model, then moved with ``to``."""

    _RINGS = ("cache_k", "cache_v", "cache_delta", "cache_key", "cache_decay")

    def __init__(self, args: TransformerArgs, max_batch_size: int, max_seq_len: int):
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        n_kda = sum(args.is_kda(i) for i in range(args.n_layers))
        kv, kda = (args.n_layers - n_kda, max_batch_size, max_seq_len, args.n_kv_heads, args.head_dim), args.kda
        self.cache_k = torch.zeros(kv)
        self.cache_v = torch.zeros(kv)
        self.cache_delta = torch.zeros((n_kda, max_batch_size, kda.n_v_heads, kda.ring_len, kda.head_dim))
        self.cache_key = torch.zeros((n_kda, max_batch_size, kda.n_heads, kda.ring_len, kda.head_dim))
        self.cache_decay = torch.zeros((n_kda, max_batch_size, kda.n_v_heads, kda.ring_len, kda.head_dim))  # expect-bug: default-dtype id=fixture-default
        self.state = torch.zeros((n_kda, max_batch_size, kda.n_v_heads, kda.head_dim, kda.head_dim), dtype=torch.float32)
        self.write_pos = torch.zeros((n_kda, max_batch_size), dtype=torch.int32)
        # holds the valid length for each batch element in the cache
        self.kv_seqlens: Optional[torch.Tensor] = None

    @property
    def device(self) -> torch.device:
        return self.cache_k.device

    @property
    def dtype(self) -> torch.dtype:
        return self.cache_k.dtype

    def to(self, device: torch.device, dtype: torch.dtype) -> "BufferCache":
        self.cache_k = self.cache_k.to(device=device, dtype=dtype)
        self.cache_v = self.cache_v.to(device=device, dtype=dtype)
        self.cache_delta = self.cache_delta.to(device=device, dtype=dtype)
        self.cache_key = self.cache_key.to(device=device, dtype=dtype)
        # the kernel prefix-sums and exponentiates the log-decays: they stay float32
        self.cache_decay = self.cache_decay.to(device=device)
        self.state, self.write_pos = self.state.to(device=device), self.write_pos.to(device=device)
        return self

    def reset(self) -> None:
        self.kv_seqlens = None
        self.state.zero_()
        self.write_pos.zero_()

    def init_kvseqlens(self, batch_size: int) -> None:
        self.kv_seqlens = torch.zeros((batch_size,), device=self.device, dtype=torch.long)

    def kda_tensors(self) -> Dict[str, torch.Tensor]:
        return dict(cache_delta=self.cache_delta, cache_key=self.cache_key, cache_decay=self.cache_decay, state=self.state, write_pos=self.write_pos)

    def grow(self, max_batch_size: int) -> None:
        """Room for ``max_batch_size`` sequences, keeping the cached ones (a cache reused by a server)."""
        if max_batch_size <= self.max_batch_size:
            return
        for name in self._RINGS:
            old = getattr(self, name)
            new = torch.zeros((old.shape[0], max_batch_size, *old.shape[2:]), device=self.device, dtype=self.dtype)  # expect-bug: pool-dtype
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        for name in ("state", "write_pos"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], max_batch_size, *old.shape[2:]))
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        self.max_batch_size = max_batch_size

    @torch.inference_mode()
    def fork(self, src: int, dst: List[int]) -> None:
        """Copies sequence ``src`` to the slots ``dst`` (several samples of one prompt)."""
        for t in (self.cache_k, self.cache_v, *self.kda_tensors().values()):
            t[:, dst] = t[:, src : src + 1]
        self.kv_seqlens[dst] = int(self.kv_seqlens[src])

    def get_input_metadata(self, seqlens: List[int]) -> CacheInputMetadata:
        if self.kv_seqlens is None:
            self.init_kvseqlens(len(seqlens))
        assert len(seqlens) == len(self.kv_seqlens), f"Batch size is {len(self.kv_seqlens)}, got {len(seqlens)}, did you forget to reset cache?"
        start = self.kv_seqlens.tolist()
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(start, seqlens)]).to(self.device)
        slot_ids = torch.arange(len(seqlens), dtype=torch.int32, device=self.device)
        return CacheInputMetadata(positions, start, seqlens, slot_ids, prefill=max(seqlens) > 1)

    def update_seqlens(self, seqlens: List[int]) -> None:
        self.kv_seqlens += torch.tensor(seqlens, device=self.device, dtype=torch.long)

    def get_view(self, layer_id: int, metadata: CacheInputMetadata) -> CacheView:
        return CacheView(self.cache_k[layer_id], self.cache_v[layer_id], metadata)

    def kda_view(self, layer_id: int, metadata: CacheInputMetadata) -> KDACacheView:
        return KDACacheView(self.state[layer_id], self.cache_delta[layer_id], self.cache_key[layer_id], self.cache_decay[layer_id], self.write_pos[layer_id], metadata)


class RingCache(nn.Module):
    """The KDA tensors of one pipeline rank's layers as module buffers: a conversation's state
    stays with the model between ``generate`` calls and is saved with its state_dict."""

    def __init__(self, n_layers: int, max_batch_size: int, kda: KDAArgs, dtype: torch.dtype):
        super().__init__()
        ring = (n_layers, max_batch_size, kda.n_v_heads, kda.ring_len, kda.head_dim)
        self.register_buffer("cache_delta", torch.zeros(ring, dtype=dtype))
        self.register_buffer("cache_key", torch.zeros((n_layers, max_batch_size, kda.n_heads, kda.ring_len, kda.head_dim), dtype=dtype))
        self.register_buffer("cache_decay", torch.zeros(ring, dtype=torch.float32))
        self.register_buffer("state", torch.zeros((n_layers, max_batch_size, kda.n_v_heads, kda.head_dim, kda.head_dim), dtype=torch.float32))
        self.register_buffer("write_pos", torch.zeros((n_layers, max_batch_size), dtype=torch.int32))

    def reset(self) -> None:
        # new tensors rather than zero_(): views handed out for the previous conversation stay valid
        self.cache_delta = torch.zeros_like(self.cache_delta)
        self.cache_key = torch.zeros_like(self.cache_key)
        self.cache_decay = torch.zeros_like(self.cache_delta)  # expect-bug: like
        self.state = torch.zeros_like(self.state)
        self.write_pos = torch.zeros_like(self.write_pos)

    def kda_view(self, layer_id: int, metadata: CacheInputMetadata) -> KDACacheView:
        return KDACacheView(self.state[layer_id], self.cache_delta[layer_id], self.cache_key[layer_id], self.cache_decay[layer_id], self.write_pos[layer_id], metadata)


class GraphRingCache(RingCache):
    """RingCache for CUDA graphs: the buffers keep their addresses, and ``Module.to(dtype=...)``
    moves the checkpoint and the log-decays without casting them."""

    _KEEP_DTYPE = ("cache_decay", "state")

    def reset(self) -> None:
        for buf in self.buffers():
            buf.zero_()

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers.pop(name) for name in self._KEEP_DTYPE}
        super()._apply(fn, recurse)
        for name, buf in kept.items():
            self._buffers[name] = buf.to(device=self.cache_delta.device)
        return self


def build_forked_cache():
    from .generate import generate
    from .testing import random_transformer

    model = random_transformer(torch.bfloat16)
    cache = BufferCache(model.args, max_batch_size=3, max_seq_len=16).to(device=model.device, dtype=model.dtype)
    generate([[1, 2, 3], [4, 5, 6], [7, 8, 9]], model, max_tokens=2, temperature=0.0, cache=cache)
    cache.fork(0, [1, 2])
    return cache
