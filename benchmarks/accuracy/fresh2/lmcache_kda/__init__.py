"""lmcache_kda: an LMCache-style cache engine for the ReplaySSM state of Kimi-Delta-Attention layers."""

__version__ = "0.2.1"
