"""Walks of :mod:`ast` trees for the cheap passes (learning, wrappers, summaries).

``ast.walk`` asks ``iter_child_nodes`` -> ``iter_fields`` for every node, including the
``Load``/``Store`` context object of every name; reading the fields directly, per node type,
and leaving the contexts out takes about half the time. A module's walk is kept while its tree
lives: the learning pass, the row-of-rings search and the import aliases walk the same tree.
"""

from __future__ import annotations

import ast
import weakref
from collections import deque

__all__ = ["walk"]

_FIELDS: dict[type, tuple[str, ...]] = {}
_WALKED: weakref.WeakKeyDictionary[ast.AST, list[ast.AST]] = weakref.WeakKeyDictionary()


def walk(node: ast.AST) -> list[ast.AST]:
    """``node`` and every node below it in ``ast.walk``'s (breadth-first) order, without the
    expression contexts (read ``node.ctx`` instead)."""
    if isinstance(node, ast.Module):
        known = _WALKED.get(node)
        if known is None:
            known = _WALKED[node] = _walk(node)
        return known
    return _walk(node)


def _walk(root: ast.AST) -> list[ast.AST]:
    found: list[ast.AST] = []
    todo: deque[ast.AST] = deque([root])
    while todo:
        node = todo.popleft()
        found.append(node)
        kind = type(node)
        fields = _FIELDS.get(kind)
        if fields is None:
            fields = _FIELDS[kind] = tuple(name for name in kind._fields if name != "ctx")
        for name in fields:
            value = getattr(node, name, None)
            if type(value) is list:
                todo.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                todo.append(value)
    return found
