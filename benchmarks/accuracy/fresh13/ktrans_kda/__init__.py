"""Kimi-Linear (KDA) decode on ReplaySSM caches, organised like KTransformers: optimisation rules
inject operator classes into a model built on the meta device, weights come from a GGUF-like
archive, and the per-layer recurrent caches live in a ``StaticCache``-like object."""

__version__ = "0.1.0"
