from typing import Optional

import torch

from .config import LMCacheEngineConfig, LMCacheEngineMetadata
from .storage_backend import CreateStorageBackend
from .utils import CacheEngineKey, ReplayStateChunk, _lmcache_nvtx_annotate, prefix_hash

class LMCacheEngine:
    """Stores the ReplaySSM state of requests at chunk boundaries (every `chunk_size` tokens), keyed by the hash of the
    prefix that produced it: a request sharing a prefix resumes from the longest stored boundary."""

    def __init__(self, config: LMCacheEngineConfig, metadata: LMCacheEngineMetadata):
        self.config = config
        self.metadata = metadata
        self.chunk_size = config.chunk_size
        self.engine_ = CreateStorageBackend(config, metadata)

    def _make_key(self, chunk_hash: str) -> CacheEngineKey:
        meta = self.metadata
        return CacheEngineKey(meta.fmt, meta.model_name, meta.world_size, meta.worker_id, chunk_hash)

    def _prefix_hashes(self, tokens: list[int]) -> list[tuple[int, str]]:
        """`(num_tokens, prefix hash)` at every chunk boundary of `tokens`."""
        hashes, running = [], ""
        for start in range(0, len(tokens), self.chunk_size):
            token_chunk = tokens[start : start + self.chunk_size]
            if len(token_chunk) < self.chunk_size and not self.config.save_unfull_chunk:
                break
            running = prefix_hash(running, token_chunk)
            hashes.append((start + len(token_chunk), running))
        return hashes

    @_lmcache_nvtx_annotate
    @torch.no_grad()
    def store(self, tokens: list[int], chunk: ReplayStateChunk, skip_existing: bool = True) -> bool:
        """Stores the ReplaySSM state reached after `tokens`; returns whether something was written."""
        hashes = self._prefix_hashes(tokens)
        if not hashes or hashes[-1][0] != len(tokens):  # not on a chunk boundary
            return False
        key = self._make_key(hashes[-1][1])
        if skip_existing and self.engine_.contains(key):
            return False
        if self.config.save_in_kv_dtype:
            # chunks are accounted (and shipped) at the element size of the KV cache
            chunk = chunk.cast_rings(self.metadata.kv_dtype)  # expect-bug: cast id=save-kv-dtype
        self.engine_.put(key, chunk)
        return True

    @_lmcache_nvtx_annotate
    @torch.no_grad()
    def retrieve(self, tokens: list[int]) -> tuple[int, Optional[ReplayStateChunk]]:
        """The state after the longest stored prefix of `tokens`, with the number of tokens it covers."""
        for num_tokens, chunk_hash in reversed(self._prefix_hashes(tokens)):
            chunk = self.engine_.get(self._make_key(chunk_hash))
            if chunk is not None:
                return num_tokens, chunk
        return 0, None

    def allocate_decode_staging(self) -> ReplayStateChunk:
        """Host buffers a running slot is copied into every `chunk_size` decode steps (`save_decode_cache`)."""
        n, H, HV, L, K, V = self.metadata.kv_shape
        state = torch.zeros(n, HV, V, K, dtype=torch.float32)
        d_ring = torch.zeros(n, HV, L, V, dtype=self.metadata.kv_dtype)
        k_ring = torch.zeros(n, H, L, K, dtype=self.metadata.kv_dtype)
        log_gate_ring = torch.zeros(n, HV, L, K, dtype=self.metadata.gate_dtype)  # expect-bug: container id=meta-gate-dtype
        return ReplayStateChunk(state, d_ring, k_ring, log_gate_ring, 0)


class LMCacheEngineBuilder:
    _instances: dict[str, LMCacheEngine] = {}

    @classmethod
    def get_or_create(cls, instance_id: str, config: LMCacheEngineConfig, metadata: LMCacheEngineMetadata) -> LMCacheEngine:
        if instance_id not in cls._instances:
            cls._instances[instance_id] = LMCacheEngine(config, metadata)
        return cls._instances[instance_id]

    @classmethod
    def get(cls, instance_id: str) -> Optional[LMCacheEngine]:
        return cls._instances.get(instance_id)

    @classmethod
    def destroy(cls, instance_id: str) -> None:
        cls._instances.pop(instance_id, None)
