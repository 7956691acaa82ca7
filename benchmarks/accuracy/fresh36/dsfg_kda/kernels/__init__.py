from .replayssm import fused_recurrent_kda_replayssm_decode, kda_gate, recurrent_kda_rows

__all__ = ["fused_recurrent_kda_replayssm_decode", "kda_gate", "recurrent_kda_rows"]
