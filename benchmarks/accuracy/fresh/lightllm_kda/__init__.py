"""Kimi-Linear (KDA) for a LightLLM-style router/model server, decoding with ReplaySSM states."""
