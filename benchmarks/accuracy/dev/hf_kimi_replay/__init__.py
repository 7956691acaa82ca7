"""A Kimi-Linear-style causal LM with a ReplaySSM decode cache, in the transformers layout."""

from .configuration_kimi_replay import KimiReplayConfig

__all__ = ["KimiReplayConfig"]
