"""Kimi Delta Attention with ReplaySSM decode, organised like flash-linear-attention."""
