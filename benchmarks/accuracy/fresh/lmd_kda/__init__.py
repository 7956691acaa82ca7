"""Kimi-Linear (KDA) on an lmdeploy-style PyTorch engine, decoding with ReplaySSM states."""
