"""Mappings made key by key: ``{k: <value> for k, v in P.items()}`` and its spelling with
``zip``, ``dict(zip(P, (<call> for v in P.values())))``: a mapping with ``P``'s keys, one value
each. Summaries record both as the dict comprehension, so importers see a per-key allocation
helper either way.
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


def per_key_parts(node: ast.DictComp) -> tuple[ast.expr, str, str | None, ast.expr] | None:
    """``(P, k, v, <value>)`` for ``{k: <value> for k, v in P.items()}`` (``v`` None for ``{k:
    <value> for k in P}`` or ``P.keys()``), unfiltered; None for any other comprehension."""
    if len(node.generators) != 1:
        return None
    loop = node.generators[0]
    source: ast.expr = loop.iter
    method = ""
    call = loop.iter
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in {"items", "keys"}
        and not (call.args or call.keywords)
    ):
        source, method = call.func.value, call.func.attr
    target = loop.target
    if method == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        key, entry = target.elts
    elif method != "items":
        key, entry = target, None
    else:
        return None
    if (
        loop.ifs
        or loop.is_async
        or not isinstance(key, ast.Name)
        or not (entry is None or isinstance(entry, ast.Name))
        or not (isinstance(node.key, ast.Name) and node.key.id == key.id)
    ):
        return None
    return source, key.id, None if entry is None else entry.id, node.value
