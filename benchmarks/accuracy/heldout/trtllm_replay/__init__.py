"""Hybrid KDA serving pieces in TensorRT-LLM's PyTorch-backend layout."""
