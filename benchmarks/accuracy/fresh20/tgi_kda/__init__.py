"""Text generation server for Kimi Delta Attention models, decoding with ReplaySSM caches."""

__version__ = "2.4.1.dev0"
