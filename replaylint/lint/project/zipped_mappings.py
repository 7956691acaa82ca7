"""``dict(zip(P, (<call> for v in P.values())))``: a mapping with ``P``'s keys, one call each.

The same helper as ``{k: <call> for k, v in P.items()}`` spelled with ``zip``; summaries record
it as that dict comprehension, so importers see a per-key allocation helper either way.
"""

from __future__ import annotations

import ast
from typing import TypeGuard


def zipped_values(node: ast.expr) -> tuple[ast.Name, str, ast.Call] | None:
    """``(P, v, <call>)`` for ``dict(zip(P, (<call> for v in P.values())))`` (or ``... in P``,
    or a list comprehension); None for anything else."""
    if not (_call_of(node, "dict") and len(node.args) == 1 and _call_of(node.args[0], "zip")):
        return None
    zipped = node.args[0]
    if len(zipped.args) != 2 or not isinstance(zipped.args[0], ast.Name):
        return None
    source, made = zipped.args[0], zipped.args[1]
    if not isinstance(made, (ast.GeneratorExp, ast.ListComp)) or len(made.generators) != 1:
        return None
    loop = made.generators[0]
    over = loop.iter
    if isinstance(over, ast.Call) and isinstance(over.func, ast.Attribute) and not over.args:
        over = over.func.value if over.func.attr == "values" else over
    if (
        loop.ifs
        or not isinstance(loop.target, ast.Name)
        or not isinstance(made.elt, ast.Call)
        or not isinstance(over, ast.Name)
        or over.id != source.id
    ):
        return None
    return source, loop.target.id, made.elt


def _call_of(node: ast.expr, name: str) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
