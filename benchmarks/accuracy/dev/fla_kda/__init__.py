"""Kimi Delta Attention with ReplaySSM decode, laid out like flash-linear-attention."""
