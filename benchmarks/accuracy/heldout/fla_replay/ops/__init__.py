from .replay import fused_kda_replayssm_decode

__all__ = ["fused_kda_replayssm_decode"]
