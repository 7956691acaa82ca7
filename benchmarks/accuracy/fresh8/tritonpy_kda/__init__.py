"""Triton Inference Server Python backend for the KDA hybrid decoder (ReplaySSM decode)."""
