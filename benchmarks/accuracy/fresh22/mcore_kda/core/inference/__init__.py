"""Inference: contexts holding the per-layer decode state, model wrappers, controllers and engines."""
