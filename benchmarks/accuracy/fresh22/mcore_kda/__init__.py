"""Kimi Delta Attention (KDA) inference on a Megatron-Core layout, with ReplaySSM decode."""

__version__ = "0.3.0"
