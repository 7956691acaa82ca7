# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

from tt_kda.modules.kda_attention import KimiDeltaAttention
from tt_kda.modules.replay_cache import (
    RingShape,
    ReplayRingCache,
    get_cache_state,
    load_cache_state,
    replay_caches,
)
from tt_kda.modules.replayssm import (
    ReplayDecodeOutput,
    fused_recurrent_kda_replayssm_decode,
    kda_log_decay,
    replay_state,
)
from tt_kda.modules.transformer import (
    FeedForward,
    RMSNorm,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)

__all__ = [
    "FeedForward", "KimiDeltaAttention", "RMSNorm", "ReplayDecodeOutput", "ReplayRingCache",
    "RingShape", "TransformerDecoder", "TransformerSelfAttentionLayer",
    "fused_recurrent_kda_replayssm_decode", "get_cache_state", "kda_log_decay",
    "load_cache_state", "replay_caches", "replay_state",
]
