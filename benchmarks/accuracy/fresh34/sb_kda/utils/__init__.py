"""Utilities: checkpointing, data helpers and hyperparameter loading."""
