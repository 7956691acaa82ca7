from .fused_recurrent import fused_recurrent_kda_replayssm_decode, pack_replay_rings

__all__ = ["fused_recurrent_kda_replayssm_decode", "pack_replay_rings"]
