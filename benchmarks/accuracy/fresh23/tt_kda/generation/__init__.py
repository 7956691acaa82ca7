# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

from tt_kda.generation._cache_pool import DecodeRings, ReplaySlotPool, RingStorage, ring_storage
from tt_kda.generation._generation import (
    BatchedGenerator,
    StagingRings,
    generate,
    generate_next_token,
    sample,
)
from tt_kda.generation._offload import CacheOffloader, PrefixRingStore
from tt_kda.generation._speculative import DraftRings, draft_decode

__all__ = [
    "BatchedGenerator", "CacheOffloader", "DecodeRings", "DraftRings", "PrefixRingStore",
    "ReplaySlotPool", "RingStorage", "StagingRings", "draft_decode", "generate",
    "generate_next_token", "ring_storage", "sample",
]
