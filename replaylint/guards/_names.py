"""Which names denote a gate cache: the linter's rule, shared by the module protection and walkers.

This is the guards' only import from the linter, kept in one place. ``replaylint.lint.gatecache.names``
is pure Python (no torch, no libcst), so importing it costs next to nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from replaylint.lint.gatecache.names import DEFAULT_GATE_CACHE_PATTERNS, GateCacheNames

__all__ = ["DEFAULT_GATE_CACHE_PATTERNS", "GateCacheNames", "gate_cache_patterns", "names_for"]


def gate_cache_patterns(
    gate_cache_names: Iterable[str] | None, extend_gate_cache_names: Iterable[str], *, where: str
) -> tuple[str, ...]:
    """The patterns in force: the defaults or ``gate_cache_names``, plus the extensions.

    The two options mean what the linter's ``gate-cache-names`` (replace the defaults) and
    ``extend-gate-cache-names`` (add to them) mean.
    """
    base = (
        DEFAULT_GATE_CACHE_PATTERNS
        if gate_cache_names is None
        else _strings(gate_cache_names, f"{where}(gate_cache_names=...)")
    )
    extra = _strings(extend_gate_cache_names, f"{where}(extend_gate_cache_names=...)")
    return tuple(dict.fromkeys((*base, *extra)))


@functools.lru_cache(maxsize=64)
def names_for(patterns: tuple[str, ...]) -> GateCacheNames:
    """The matcher for ``patterns`` (built once per distinct tuple)."""
    return GateCacheNames(patterns)


def _strings(values: Iterable[str], where: str) -> tuple[str, ...]:
    if isinstance(values, (str, bytes)):
        raise TypeError(
            f"{where} takes a list of name patterns, e.g. [{values!r}]; got the string {values!r}."
        )
    patterns = tuple(values)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip():
            raise TypeError(
                f"{where} takes non-empty strings (shell-style patterns such as 'g_cache' or "
                f"'*_gates'); got {pattern!r}."
            )
    return patterns
