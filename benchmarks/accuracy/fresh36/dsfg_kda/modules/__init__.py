from .kda_attention import DSKDAAttention, DSKDAConfig, KDARingBuffers, ModuleRingCache, PinnedKDARingBuffers

__all__ = ["DSKDAAttention", "DSKDAConfig", "KDARingBuffers", "ModuleRingCache", "PinnedKDARingBuffers"]
