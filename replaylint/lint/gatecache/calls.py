"""Reading calls with :mod:`ast`, for the passes that learn gate-cache names: the dotted name a
call is written with, the import aliases that rename an entry point, which argument a call passes
for an entry point's gate cache, and the name a passed value is known by."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from replaylint.lint.gatecache.entry_points import EntryPoint

__all__ = ["argument_for", "dotted", "entry_point_of", "import_aliases", "passed_name"]

# Calls that return their receiver's data with the same name-worthy identity.
_TRANSPARENT_METHODS = frozenset(
    {"contiguous", "view", "reshape", "detach", "flatten", "squeeze", "unsqueeze", "cuda", "to"}
)


def entry_point_of(
    written: str | None, aliases: dict[str, str], entry_points: Sequence[EntryPoint]
) -> EntryPoint | None:
    if written is None:
        return None
    head, _, rest = written.partition(".")
    resolved = aliases.get(head, head) + (f".{rest}" if rest else "")
    for entry_point in entry_points:
        if entry_point.matches(written) or entry_point.matches(resolved):
            return entry_point
    return None


def argument_for(call: ast.Call, parameter: str, index: int | None) -> ast.expr | None:
    """What ``call`` passes for ``parameter``, by keyword or at place ``index``; None when it is
    not written (or a ``*`` spread comes first)."""
    for keyword in call.keywords:
        if keyword.arg == parameter:
            return keyword.value
    if index is None or index >= len(call.args):
        return None
    if any(isinstance(arg, ast.Starred) for arg in call.args[: index + 1]):
        return None
    return call.args[index]


def passed_name(expr: ast.expr) -> str | None:
    """``ring`` / ``self.ring`` / ``caches["ring"]`` / ``self.ring[layer].contiguous()`` -> ring."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Attribute):
            return expr.attr
        if isinstance(expr, ast.Subscript):
            key = expr.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return key.value
            expr = expr.value
            continue
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in _TRANSPARENT_METHODS
        ):
            expr = expr.func.value
            continue
        return None


def dotted(expr: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):  # a loop: generated chains can be thousands long
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """``from ops import kda_replayssm_decode as decode`` -> {"decode": "ops.kda_replayssm_decode"}."""
    aliases: dict[str, str] = {}
    body = tree.body if isinstance(tree, ast.Module) else []
    for statement in body:
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if alias.asname is not None:
                    aliases[alias.asname] = f"{statement.module or ''}.{alias.name}".lstrip(".")
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname is not None:
                    aliases[alias.asname] = alias.name
    return aliases
