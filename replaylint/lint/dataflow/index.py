"""What is known about one parsed module before any question is asked: its imports and scopes.

A :class:`ModuleIndex` is built per file and answers name questions — which dotted name an
expression denotes through the module's imports, which bindings a scope holds, how often a local
is read — each computed on first use and kept for the file's other questions.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.imports import ImportTable
from replaylint.lint.dataflow.scopes import Binding, Scope, build_scope
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.syntax.nodes import read_names
from replaylint.lint.syntax.sites import ScopeNode


class ModuleIndex:
    """Name resolution and local bindings of one module, built lazily."""

    def __init__(self, module: cst.Module, gate_caches: GateCacheNames) -> None:
        self.module = module
        self.gate_caches = gate_caches
        self._imports: ImportTable | None = None
        self._scopes: dict[int, Scope] = {}
        self._reads: dict[tuple[int, str], int] = {}

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully resolved dotted names of ``node`` (``th.zeros`` -> ``{"torch.zeros"}``).

        A name no import binds resolves to itself (``x.half`` -> ``{"x.half"}``); an expression
        that is not a dotted name (a call, a subscript) resolves to nothing.
        """
        return self._import_table().resolve(node)[0]

    def imported_names(self, node: cst.CSTNode) -> set[str]:
        """Like :meth:`qualified_names`, but only for names that come from an import."""
        names, imported = self._import_table().resolve(node)
        return names if imported else set()

    def _import_table(self) -> ImportTable:
        if self._imports is None:
            self._imports = ImportTable(self.module)
        return self._imports

    def scope(self, node: ScopeNode) -> Scope:
        """The bindings of ``node``'s own body, built on first use."""
        scope = self._scopes.get(id(node))
        if scope is None:
            scope = self._scopes[id(node)] = build_scope(node)
        return scope

    def read_once(self, binding: Binding) -> bool:
        """Whether the local that ``binding`` makes is read exactly once in its scope."""
        if binding.scope is None:
            return False
        key = (id(binding.scope), binding.name)
        count = self._reads.get(key)
        if count is None:
            scope = self.scope(binding.scope)
            written = sum(
                1 for b in scope.bindings.get(binding.name, ()) if isinstance(b.node, cst.Name)
            )
            total = sum(1 for n in read_names(binding.scope) if n.value == binding.name)
            count = self._reads[key] = total - written
        return count == 1
