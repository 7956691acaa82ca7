"""Wording shared by the rules' messages."""

from __future__ import annotations

from replaylint.lint.analysis import GateCacheBinding
from replaylint.lint.context import FileContext


def gate_cache_subject(context: FileContext, binding: GateCacheBinding) -> str:
    """``gate cache `self.g_cache``` plus, for a learned name, the call that taught it."""
    subject = f"gate cache `{binding.display}`"
    learned = context.gate_caches.learned_from(binding.name)
    if learned is not None:
        subject += f" ({learned.describe()})"
    return subject
