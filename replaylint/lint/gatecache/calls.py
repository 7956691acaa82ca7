"""Reading calls with :mod:`ast`, for the passes that learn gate-cache names: the dotted name a
call is written with, the import aliases that rename an entry point, which argument a call passes
for an entry point's gate cache, and the name a passed value is known by."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence

from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.syntax.ast_walk import walk

__all__ = [
    "LocalValues",
    "SpreadLengths",
    "argument_for",
    "dotted",
    "entry_point_of",
    "import_aliases",
    "passed_name",
    "spread_lengths",
]

SpreadLengths = Callable[[ast.expr], "int | None"]
"""How many values a ``*`` spread passes, when the module says so (None: unknown)."""

_MAX_ALIASES = 8  # names bound to names followed to reach a sequence

# Calls that return their receiver's data with the same name-worthy identity.
_TRANSPARENT_METHODS = frozenset(
    {"contiguous", "view", "reshape", "detach", "flatten", "squeeze", "unsqueeze", "cuda", "to"}
)
# `torch.float32` in a dtype table keyed by the ring names (`{"g_cache": torch.float32}`) is no ring
_DTYPE_ATTRIBUTES = frozenset(
    {
        "float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16",
        "int32", "int64", "uint8", "bool", "long", "complex64", "complex128",
    }
)  # fmt: skip


def entry_point_of(
    written: str | None, aliases: dict[str, str], entry_points: Sequence[EntryPoint]
) -> EntryPoint | None:
    if written is None:
        return None
    resolved = aliases.get(written) or _resolved(written, aliases)
    for entry_point in entry_points:
        if entry_point.matches(written) or entry_point.matches(resolved):
            return entry_point
    return None


def argument_for(
    call: ast.Call, parameter: str, index: int | None, spread: SpreadLengths | None = None
) -> ast.expr | None:
    """What ``call`` passes for ``parameter``, by keyword or at place ``index``; None when it is
    not written, or a ``*`` spread comes first whose length ``spread`` does not know."""
    for keyword in call.keywords:
        if keyword.arg == parameter:
            return keyword.value
    if index is None:
        return None
    place = 0
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            length = spread(arg.value) if spread is not None else None
            if length is None:
                return None
            if place + length > index:
                return None  # the spread itself passes the parameter
            place += length
            continue
        if place == index:
            return arg
        place += 1
    return None


def spread_lengths(tree: ast.AST) -> SpreadLengths:
    """How many values ``*inputs`` passes, for a sequence of a length the module fixes: a tuple
    or list display, a comprehension over one, ``tuple(...)``/``list(...)`` of one, or a name
    bound once in the module to such a sequence (``inputs = [make(s) for s in sizes]`` with
    ``sizes = [...]``)."""
    values: dict[str, list[ast.expr | None]] = {}  # None: a binding that says no length
    stores: dict[str, int] = {}
    for node in walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.arg):
            values.setdefault(node.arg, []).append(None)
        elif isinstance(node, ast.alias):
            values.setdefault((node.asname or node.name).partition(".")[0], []).append(None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            values.setdefault(node.name, []).append(None)

    def value_of(name: str) -> ast.expr | None:
        bound = values.get(name, [])
        if len(bound) != 1 or stores.get(name, 0) != 1:
            return None  # bound more than once, or by a statement that says no length
        return bound[0]

    def length(expr: ast.expr, depth: int = 0) -> int | None:
        if depth > _MAX_ALIASES:
            return None
        if isinstance(expr, (ast.Tuple, ast.List)):
            if any(isinstance(element, ast.Starred) for element in expr.elts):
                return None
            return len(expr.elts)
        if isinstance(expr, (ast.ListComp, ast.GeneratorExp)):
            if len(expr.generators) != 1:
                return None
            (loop,) = expr.generators
            if loop.ifs or loop.is_async:
                return None
            return length(loop.iter, depth + 1)
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and expr.func.id in {"tuple", "list"}
            and len(expr.args) == 1
            and not expr.keywords
        ):
            return length(expr.args[0], depth + 1)
        if isinstance(expr, ast.Name):
            value = value_of(expr.id)
            return None if value is None else length(value, depth + 1)
        return None

    return length


def passed_name(expr: ast.expr) -> str | None:
    """``ring`` / ``self.ring`` / ``caches["ring"]`` / ``self.ring[layer].contiguous()`` -> ring."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Attribute):
            return None if expr.attr in _DTYPE_ATTRIBUTES else expr.attr
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
    """The names that rename a callable: ``from ops import kda_replayssm_decode as decode`` ->
    {"decode": "ops.kda_replayssm_decode"}, and a name or attribute bound to a dotted name anywhere
    in the module (``self.decode_op = kernels.kda_replayssm_decode``,
    ``_decode = ops.kda_replayssm_decode``): the call ``self.decode_op(...)`` runs that function.
    A target bound to two different names is no alias."""
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
    assigned: dict[str, str | None] = {}
    for node in _statements(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = dotted(node.targets[0]), dotted(node.value)
            if target is not None and value is not None and target != value:
                assigned[target] = value if assigned.get(target, value) == value else None
    imported = dict(aliases)
    for target, value in assigned.items():
        if value is not None and target not in aliases:
            aliases[target] = _resolved(value, imported)
    return aliases


def _statements(tree: ast.AST) -> Iterator[ast.stmt]:
    """Every statement of ``tree``, at any depth, without a walk of its expressions."""
    pending: list[ast.AST] = list(getattr(tree, "body", ()))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.stmt):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                pending.extend(item for item in block if isinstance(item, ast.AST))


def _resolved(written: str, aliases: dict[str, str]) -> str:
    """``written`` with an import alias at its head spelled out."""
    head, _, rest = written.partition(".")
    return aliases.get(head, head) + (f".{rest}" if rest else "")


class LocalValues:
    """What a local that a call passes was bound to in its function: ``d, k, g = self.d_buf,
    self.k_buf, self.forget_cache`` then ``decode(..., g, ...)`` passes ``self.forget_cache``.
    Built on the first question (a walk of the module's functions); each function's assignments
    are read once, on the first question about it."""

    def __init__(self, tree: ast.AST) -> None:
        self._tree = tree
        self._owner: dict[int, ast.AST] | None = None
        self._bound: dict[int, dict[str, list[ast.expr]]] = {}

    def values(self, call: ast.Call, name: str) -> list[ast.expr]:
        """Every value ``name`` is bound to, by a plain or an unpacking assignment, in the
        function around ``call`` (the innermost one)."""
        if self._owner is None:
            self._owner = {}
            for function in walk(self._tree):  # breadth first: inner functions come later
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in walk(function):
                        if isinstance(node, ast.Call):
                            self._owner[id(node)] = function
        owner = self._owner.get(id(call))
        if owner is None:
            return []
        bound = self._bound.get(id(owner))
        if bound is None:
            bound = self._bound[id(owner)] = _assigned_values(owner)
        return bound.get(name, [])


def _assigned_values(function: ast.AST) -> dict[str, list[ast.expr]]:
    """Name -> the values a plain or an unpacking assignment in ``function`` binds it to."""
    bound: dict[str, list[ast.expr]] = {}
    for node in walk(function):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, []).append(node.value)
            elif (
                isinstance(target, (ast.Tuple, ast.List))
                and isinstance(node.value, (ast.Tuple, ast.List))
                and len(target.elts) == len(node.value.elts)
                and not any(isinstance(e, ast.Starred) for e in node.value.elts)
            ):
                for element, value in zip(target.elts, node.value.elts, strict=True):
                    if isinstance(element, ast.Name):
                        bound.setdefault(element.id, []).append(value)
    return bound
