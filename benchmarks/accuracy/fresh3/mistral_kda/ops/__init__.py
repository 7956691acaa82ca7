"""Kernel bindings (``mistral_kda.ops.kda``)."""
