"""Resolving names through a module's imports: ``th.zeros`` -> ``torch.zeros``.

This is what the rules need from name resolution — which torch function, dtype or loader an
expression names, through any import alias (``import torch as th``, ``from torch import zeros``,
``import torch.nn as nn``) — at a fraction of the cost of libcst's scope analysis, which builds
every scope and every access of the file and dominated analysis time. Imports anywhere in the
file count (a function-local ``import torch`` is common in model code); a local variable that
shadows an imported name is not tracked, a trade-off accepted because no real code we have seen
rebinds ``torch`` or ``np``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst

from replaylint.lint.syntax.nodes import dotted_name

_BLOCK_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")


def _module_name(node: cst.ImportFrom) -> str:
    dots = "." * len(node.relative)
    module = "" if node.module is None else (dotted_name(node.module) or "")
    return dots + module


class ImportTable:
    """Every name an ``import`` statement of the module binds, and what it binds it to."""

    def __init__(self, module: cst.Module) -> None:
        self.bindings: dict[str, set[str]] = {}
        self._collect(module.body)

    def _bind(self, name: str, target: str) -> None:
        self.bindings.setdefault(name, set()).add(target)

    def _collect(self, statements: Iterable[cst.CSTNode]) -> None:
        for statement in statements:
            if isinstance(statement, cst.SimpleStatementLine):
                self._collect_small(statement.body)
            elif isinstance(
                statement,
                (
                    cst.BaseCompoundStatement,
                    cst.ExceptHandler,
                    cst.ExceptStarHandler,
                    cst.MatchCase,
                    cst.Else,
                    cst.Finally,
                    cst.If,
                ),
            ):
                for field in _BLOCK_FIELDS:
                    self._collect_block(getattr(statement, field, None))

    def _collect_block(self, block: object) -> None:
        if block is None:
            return
        if isinstance(block, cst.SimpleStatementSuite):
            self._collect_small(block.body)
        elif isinstance(block, cst.IndentedBlock):
            self._collect(block.body)
        elif isinstance(block, Sequence):
            self._collect(item for item in block if isinstance(item, cst.CSTNode))
        elif isinstance(block, cst.CSTNode):
            self._collect([block])

    def _collect_small(self, statements: Iterable[cst.BaseSmallStatement]) -> None:
        for small in statements:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = dotted_name(alias.name) or ""
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        self._bind(alias.asname.name.value, full)
                    else:
                        head = full.partition(".")[0]
                        self._bind(head, head)
            elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                module = _module_name(small)
                for alias in small.names:
                    imported = dotted_name(alias.name) or ""
                    local = (
                        alias.asname.name.value
                        if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                        else imported
                    )
                    separator = "" if module.endswith(".") or not module else "."
                    self._bind(local, f"{module}{separator}{imported}")

    def resolve(self, node: cst.CSTNode) -> tuple[set[str], bool]:
        """(dotted names ``node`` may denote, whether they come from an import)."""
        written = dotted_name(node)
        if written is None:
            return set(), False
        head, dot, rest = written.partition(".")
        targets = self.bindings.get(head)
        if targets is None:
            return {written}, False
        return {f"{target}{dot}{rest}" for target in targets}, True
