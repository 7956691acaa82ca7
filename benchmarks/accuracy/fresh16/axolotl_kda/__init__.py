"""Kimi Linear (KDA) decode caches for an axolotl-style fine-tuning stack, on plain torch."""

__version__ = "0.1.0"
