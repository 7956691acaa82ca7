from .actor import Actor, FP32GateReplayCache, KDAConfig, KDAForCausalLM, KDAReplayCache
from .kda_ops import advance_write_pos, fused_recurrent_kda_replayssm_decode

__all__ = [
    "Actor",
    "FP32GateReplayCache",
    "KDAConfig",
    "KDAForCausalLM",
    "KDAReplayCache",
    "advance_write_pos",
    "fused_recurrent_kda_replayssm_decode",
]
