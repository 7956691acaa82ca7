"""What a function's return annotation says it returns, for its summary.

Typed projects name the class of what a function returns even where its body cannot be
followed: ``def replay_caches(model) -> Iterator[Tuple[str, ReplayCache]]`` walks
``model.named_modules()`` and filters by ``isinstance``. The annotation is kept as:

``["instance", v]``
    ``-> ReplayCache``, ``-> Optional[ReplayCache]``, ``-> "ReplayCache"``;
``["elements", v]``
    ``-> list[ReplayCache]``, ``Sequence[...]``, ``Iterator[...]``, ``Generator[ReplayCache, ...]``;
``["pairs", [v or None, ...]]``
    ``-> Iterator[tuple[str, ReplayCache]]``: the items are tuples, one value per position;

``v`` is the annotated name as a summary value. Whether it is a class is decided where it is
asked, by resolving it in the project.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from replaylint.lint.project.module_facts import dotted

__all__ = ["returned_annotation"]

Value = list[Any]

_OPTIONAL = frozenset({"Optional", "typing.Optional"})
_SEQUENCES = frozenset(
    {"list", "List", "Sequence", "Iterable", "Iterator", "Generator", "Collection", "set", "Set"}
    | {"frozenset", "FrozenSet", "deque", "Deque", "MutableSequence", "tuple", "Tuple"}
)


def returned_annotation(
    annotation: ast.expr | None, value_of: Callable[[ast.expr], Value]
) -> Value | None:
    """The return annotation ``annotation`` as a summary entry (see the module docstring)."""
    node = _unwrapped(annotation)
    if node is None:
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        return ["instance", value_of(node)]
    if not isinstance(node, ast.Subscript):
        return None
    wrapper = dotted(node.value).rpartition(".")[2]
    if wrapper not in _SEQUENCES:
        return None
    arguments = _arguments(node)
    if wrapper in {"tuple", "Tuple"} and not (
        len(arguments) == 2 and isinstance(arguments[1], ast.Constant) and arguments[1].value is ...
    ):
        return None  # a fixed-length tuple is a record, not a collection of one class
    element = _unwrapped(arguments[0]) if arguments else None
    if isinstance(element, (ast.Name, ast.Attribute)):
        return ["elements", value_of(element)]
    if (
        isinstance(element, ast.Subscript)
        and dotted(element.value).rpartition(".")[2] in {"tuple", "Tuple"}
        and not any(isinstance(a, ast.Constant) and a.value is ... for a in _arguments(element))
    ):
        positions = [_unwrapped(a) for a in _arguments(element)]
        return [
            "pairs",
            [value_of(p) if isinstance(p, (ast.Name, ast.Attribute)) else None for p in positions],
        ]
    return None


def _arguments(node: ast.Subscript) -> list[ast.expr]:
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _unwrapped(node: ast.expr | None) -> ast.expr | None:
    """``X`` of ``"X"``, ``Optional[X]``, ``X | None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Subscript) and dotted(node.value) in _OPTIONAL:
        return _unwrapped(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not _is_none(s)]
        return _unwrapped(sides[0]) if len(sides) == 1 else None
    return node


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
