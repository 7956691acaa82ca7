"""Kimi Linear (KDA) serving with ReplaySSM decode, laid out like text-generation-inference's server."""
