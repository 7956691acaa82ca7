"""One depth-first walk of a module that drives every rule's ``visit_*``/``leave_*`` methods.

libcst's own visitor machinery rebuilds each node's children through a generic protocol and
visits every whitespace, comma and parenthesis token; on real files that cost four times the
parse. Rules only look at syntax nodes, so this walk reads children straight from the node's
dataclass fields (in declaration order, which is source order for everything rules rely on:
statements, arguments, targets before values) and skips formatting tokens. Return values of
``visit_*`` are ignored, as in libcst's batched visitors.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence

import libcst as cst

_FORMATTING = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
    cst.ImportStar,
)

Handler = Callable[[cst.CSTNode], object]
_FIELDS: dict[type, tuple[str, ...]] = {}
# Per concrete type: is it a node to walk into? (isinstance against libcst's abstract base
# classes costs a microsecond each; a dict lookup per value is far cheaper.)
_WALKABLE: dict[type, bool] = {}


def _child_fields(kind: type) -> tuple[str, ...]:
    """The fields of ``kind`` that may hold a syntax node, in declaration order: whitespace,
    parentheses and commas are a node's most numerous fields, and reading them costs more than
    the rest of a walk."""
    fields = _FIELDS.get(kind)
    if fields is None:
        try:
            hints = typing.get_type_hints(kind)
        except Exception:  # an annotation that cannot be resolved: read every field
            hints = {}
        fields = _FIELDS[kind] = tuple(
            f.name
            for f in dataclasses.fields(kind)
            if f.name not in hints or _may_hold_syntax(hints[f.name])
        )
    return fields


def _may_hold_syntax(annotation: object) -> bool:
    """Whether a value of this field annotation may be a node :func:`walk` visits (``Sequence[
    Comma]`` or ``BaseParenthesizableWhitespace`` never is)."""
    if isinstance(annotation, type):
        return issubclass(annotation, cst.CSTNode) and not issubclass(annotation, _FORMATTING)
    if typing.get_origin(annotation) is typing.Literal:
        return False
    arguments = typing.get_args(annotation)
    if not arguments:  # a type variable, a forward reference: not known, so read it
        return True
    return any(_may_hold_syntax(argument) for argument in arguments)


def _walkable(kind: type) -> bool:
    walkable = _WALKABLE.get(kind)
    if walkable is None:
        walkable = _WALKABLE[kind] = issubclass(kind, cst.CSTNode) and not issubclass(
            kind, _FORMATTING
        )
    return walkable


_VISITOR_NAMES: dict[type, tuple[str, ...]] = {}


class Visitor(cst.BatchableCSTVisitor):
    """A visitor for :func:`walk` whose hooks are found once per class, not once per file."""

    def get_visitors(self) -> Mapping[str, Callable[[cst.CSTNode], None]]:
        """libcst's own version inspects every attribute of the instance (thousands of no-op
        stubs) for each file; the names depend only on the class, so they are found once."""
        names = _VISITOR_NAMES.get(type(self))
        if names is None:
            names = _VISITOR_NAMES[type(self)] = tuple(
                name
                for name in dir(type(self))
                if name.startswith(("visit_", "leave_"))
                and callable(method := getattr(type(self), name))
                and getattr(method, "__name__", "").startswith(("visit_", "leave_"))
                and not getattr(method, "_is_no_op", False)
            )
        return {name: getattr(self, name) for name in names}


def walk(module: cst.Module, visitors: Sequence[cst.BatchableCSTVisitor]) -> None:
    """Call each visitor's ``visit_<Node>`` before and ``leave_<Node>`` after a node's children."""
    entering: dict[str, list[Handler]] = {}
    leaving: dict[str, list[Handler]] = {}
    for visitor in visitors:
        for name, function in visitor.get_visitors().items():
            kind, _, node_name = name.partition("_")
            table = entering if kind == "visit" else leaving if kind == "leave" else None
            if table is None or "_" in node_name:  # visit_Call_func-style hooks are not used
                continue
            table.setdefault(node_name, []).append(function)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        _walk(module, entering, leaving)
    finally:
        sys.setrecursionlimit(limit)


def _walk(
    node: cst.CSTNode,
    entering: dict[str, list[Handler]],
    leaving: dict[str, list[Handler]],
) -> None:
    name = type(node).__name__
    for function in entering.get(name, ()):
        function(node)
    for field in _child_fields(type(node)):
        value = getattr(node, field)
        kind = type(value)
        if kind is tuple or kind is list:
            for item in value:
                if _WALKABLE.get(type(item)) or _walkable(type(item)):
                    _walk(item, entering, leaving)
        elif _WALKABLE.get(kind) or _walkable(kind):
            _walk(value, entering, leaving)
    for function in leaving.get(name, ()):
        function(node)


def syntax_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node``'s children that :func:`walk` visits (formatting tokens left out), in order."""
    children: list[cst.CSTNode] = []
    for field in _child_fields(type(node)):
        value = getattr(node, field)
        kind = type(value)
        if kind is tuple or kind is list:
            children.extend(
                item for item in value if _WALKABLE.get(type(item)) or _walkable(type(item))
            )
        elif _WALKABLE.get(kind) or _walkable(kind):
            children.append(value)
    return children


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every syntax node below it (formatting tokens left out), parents first.

    libcst's ``children`` property rebuilds a node's children through its visitor protocol on
    every access; reading the fields directly is about ten times faster on large modules.
    """
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(syntax_children(current)))


def branch_tests(path: Sequence[cst.CSTNode]) -> list[tuple[cst.BaseExpression, bool]]:
    """The tests of the ``if`` statements and conditional expressions on ``path`` (nodes from an
    outer one down to a target, as :func:`ancestors` gives them, then the target) that decide
    whether the target runs, each with whether it is in the branch taken when the test holds."""
    return [
        (parent.test, child is parent.body)
        for parent, child in itertools.pairwise(path)
        if isinstance(parent, (cst.If, cst.IfExp)) and child is not parent.test
    ]


def ancestors(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes from ``root`` down to ``target``'s parent, outermost first; empty when
    ``target`` is ``root`` or not below it."""
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode]]] = [(root, [])]
    while stack:
        node, above = stack.pop()
        if node is target:
            return above
        stack.extend((child, [*above, node]) for child in syntax_children(node))
    return []
