"""Kernels used by the decoder (CPU reference implementations)."""

from pl_kda.ops.replayssm import (
    advance_write_pos,
    fused_recurrent_kda_replayssm_decode,
    kda_gate,
    last_decode_call,
)

__all__ = ["advance_write_pos", "fused_recurrent_kda_replayssm_decode", "kda_gate", "last_decode_call"]
