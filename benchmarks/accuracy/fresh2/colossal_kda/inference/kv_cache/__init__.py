from .kvcache_manager import KVCacheManager

__all__ = ["KVCacheManager"]
