"""What an ``import`` statement binds, as summary values (:mod:`.summaries`): ``import x.y``
binds the module ``x`` (``["module", "x"]``), ``import x.y as z`` the module ``x.y``, ``from .m
import n as k`` a reference to ``n`` of ``.m`` (``["ref", ".m", "n"]``, relative modules keep
their dots)."""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["imported_values", "module_spec"]


def module_spec(node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, with its leading dots."""
    return "." * node.level + (node.module or "")


def imported_values(statement: ast.Import | ast.ImportFrom) -> list[tuple[str, list[Any]]]:
    """``(name, value)`` for every name ``statement`` binds (a star import binds none here)."""
    found: list[tuple[str, list[Any]]] = []
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.asname is not None:
                found.append((alias.asname, ["module", alias.name]))
            else:
                head = alias.name.partition(".")[0]
                found.append((head, ["module", head]))
    else:
        spec = module_spec(statement)
        found.extend(
            (alias.asname or alias.name, ["ref", spec, alias.name])
            for alias in statement.names
            if alias.name != "*"
        )
    return found
