"""Which gate cache a write in a loop over names stores into, when its key is not a gate-cache
name itself: a per-layer list the loop variable holds (``for kind, rings in zip(KINDS,
(self.d_cache, self.g_cache))``), or the entry of a local dict the function reads into a gate
cache (``grown = {name: ... for name in ("d", "gate")}``; ``self.g_cache = grown["gate"]``)."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.strings import Bound, Iteration
from replaylint.lint.gatecache.lists import list_names
from replaylint.lint.rules.unlisted_keys import gate_bound_keys
from replaylint.lint.syntax.nodes import binding_name
from replaylint.lint.syntax.sites import Site

__all__ = ["LoopNames"]


class LoopNames:
    """The module's questions about the names a loop's writes store under."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._lists: frozenset[str] | None = None

    def held_gate(
        self, holder: cst.BaseExpression | str | None, env: Iteration, appended: bool
    ) -> str | None:
        """The gate-cache name of the list of rings the loop variable ``holder`` holds in
        ``env`` (``rings`` in ``for kind, rings in zip(KINDS, (self.d_cache, self.g_cache))``);
        an element written into a tensor is a copy, which casts."""
        if not isinstance(holder, cst.Name):
            return None
        held = env.get(holder.value)
        if not isinstance(held, Bound):
            return None
        name = binding_name(held.expr)
        if name is None or not self.context.gate_caches.matches(name):
            return None
        if not appended and name not in self.lists():
            return None
        return name

    def read_as_gate(
        self, mapping: cst.BaseExpression | str | None, key: str, site: Site
    ) -> str | None:
        """The gate cache the function reads the local dict's entry ``key`` into."""
        local = mapping.value if isinstance(mapping, cst.Name) else mapping
        if not isinstance(local, str):
            return None
        return gate_bound_keys(self.context, local, site).get(key)

    def lists(self) -> frozenset[str]:
        """The gate caches this module keeps as lists of tensors."""
        if self._lists is None:
            self._lists = list_names(self.context.module, self.context.gate_caches)
        return self._lists
