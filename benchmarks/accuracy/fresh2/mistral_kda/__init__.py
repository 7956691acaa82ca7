"""Kimi-Linear (Kimi Delta Attention with the ReplaySSM cache) in the layout of mistral-inference:
args from ``params.json``, a BufferCache with per-layer views, ``Transformer.from_folder``,
pipeline-parallel ranks, LoRA adapters and ``generate``."""
