from .kv_cache import ReplayCache, ReplayCachePool, ReplayRows, ReplaySpec
from .replay import advance_write_pos, kda_gate, replay_decode

__all__ = [
    "ReplayCache",
    "ReplayCachePool",
    "ReplayRows",
    "ReplaySpec",
    "advance_write_pos",
    "kda_gate",
    "replay_decode",
]
