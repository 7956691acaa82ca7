"""What a generator method yields, item by item: the walks a class offers over its own tensors.

Ring pools and state records often expose their tensors through a generator rather than a dict:

    def named_states(self):
        yield "state", self.state
        for name in self.ring_names:
            yield name, getattr(self, name)

A loop elsewhere (``{name: t.half() for name, t in pool.named_states()}``) then walks every ring,
the gate ring among them. The summary lists the items in order, as ``["yields", [item, ...]]``,
so such a loop can be judged one item at a time like a loop over a literal tuple. A ``for`` over
the class's own names is expanded: a tuple of string literals, a class constant holding one
(``ring_names = ("delta_ring", ...)``, also spread into a tuple: ``("state", *self.ring_names)``)
or the fields of a dataclass (``for item in fields(self): yield item.name, getattr(self,
item.name)``); in each item the loop variable becomes the name it holds and ``getattr(self,
"<name>")`` becomes ``self.<name>``. Any other statement (a condition, ``yield from``, an
assignment) leaves the method unsummarised: which items it yields is not certain.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any

from replaylint.lint.project.records import CONDITIONAL

__all__ = ["is_generator", "yielded"]

Value = list[Any]


def yielded(
    method: ast.FunctionDef | ast.AsyncFunctionDef,
    cls: ast.ClassDef,
    value_of: Callable[[ast.expr], Value],
) -> Value | None:
    """``["yields", [item, ...]]`` for a generator method of ``cls`` made of plain ``yield``
    statements and ``for`` loops over the class's own names; None for any other body."""
    body = list(method.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    items: list[Value] = []
    for statement in body:
        one = _yield_value(statement)
        if one is not None:
            items.append(value_of(one))
            continue
        if not (
            isinstance(statement, ast.For)
            and not statement.orelse
            and isinstance(statement.target, ast.Name)
            and len(statement.body) == 1
        ):
            return None
        element = _yield_value(statement.body[0])
        walked = _walked_names(statement.iter, cls)
        if element is None or walked is None:
            return None
        names, by_field = walked
        variable = statement.target.id
        for name in names:
            items.append(value_of(_substituted(element, variable, name, by_field)))
    return ["yields", items] if items else None


def is_generator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function``'s own body yields (a nested function's yield is its own)."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _yield_value(statement: ast.stmt) -> ast.expr | None:
    """``X`` of a statement ``yield X``."""
    if (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Yield)
        and statement.value.value is not None
    ):
        return statement.value.value
    return None


def _walked_names(iterable: ast.expr, cls: ast.ClassDef) -> tuple[list[str], bool] | None:
    """The names a loop over ``iterable`` takes, and whether they are dataclass fields (read
    as ``item.name``); None when they are not certain."""
    if (
        isinstance(iterable, ast.Call)
        and len(iterable.args) == 1
        and not iterable.keywords
        and isinstance(iterable.args[0], ast.Name)
        and iterable.args[0].id == "self"
        and (
            (isinstance(iterable.func, ast.Name) and iterable.func.id == "fields")
            or (isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "fields")
        )
    ):
        fields = _dataclass_fields(cls)
        return None if fields is None else (fields, True)
    names = _strings(iterable, cls, 0)
    return None if names is None else (names, False)


def _strings(node: ast.expr, cls: ast.ClassDef, depth: int) -> list[str] | None:
    if depth > 2:
        return None
    if isinstance(node, (ast.Tuple, ast.List)):
        found: list[str] = []
        for element in node.elts:
            part = (
                _strings(element.value, cls, depth + 1)
                if isinstance(element, ast.Starred)
                else _strings(element, cls, depth + 1)
            )
            if part is None:
                return None
            found.extend(part)
        return found
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        constant = _class_constant(cls, node.attr)
        if constant is not None and isinstance(constant, (ast.Tuple, ast.List)):
            return _strings(constant, cls, depth + 1)
    return None


def _class_constant(cls: ast.ClassDef, name: str) -> ast.expr | None:
    """The value ``name`` is bound to once in the class body (and nowhere else in it)."""
    found: list[ast.expr] = []
    for statement in cls.body:
        if isinstance(statement, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in statement.targets):
                found.append(statement.value)
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == name
            and statement.value is not None
        ):
            found.append(statement.value)
        elif isinstance(statement, CONDITIONAL):
            for node in ast.walk(statement):
                if isinstance(node, ast.Name) and node.id == name:
                    return None
    for node in ast.walk(cls):  # `self.ring_names = ...` in a method shadows the constant
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and node.attr == name
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return None
    return found[0] if len(found) == 1 else None


def _dataclass_fields(cls: ast.ClassDef) -> list[str] | None:
    """The fields of a dataclass without base classes, in order."""
    decorated = any(
        "dataclass" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
        for d in cls.decorator_list
    )
    if not decorated or cls.bases:
        return None
    fields: list[str] = []
    for statement in cls.body:
        if isinstance(statement, CONDITIONAL):
            return None
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            written = ast.unparse(statement.annotation)
            if "ClassVar" in written or "InitVar" in written or "KW_ONLY" in written:
                continue
            fields.append(statement.target.id)
    return fields


class _Substitute(ast.NodeTransformer):
    """The loop variable replaced by the name it holds in one iteration."""

    def __init__(self, variable: str, name: str, by_field: bool) -> None:
        self.variable, self.name, self.by_field = variable, name, by_field

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if (
            self.by_field
            and node.attr == "name"
            and isinstance(node.value, ast.Name)
            and node.value.id == self.variable
        ):
            return ast.Constant(self.name)  # `item.name` of `for item in fields(self)`
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.variable and not self.by_field:
            return ast.Constant(self.name)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) == 2
            and not node.keywords
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            return ast.Attribute(ast.Name("self", ast.Load()), node.args[1].value, ast.Load())
        return node


def _substituted(element: ast.expr, variable: str, name: str, by_field: bool) -> ast.expr:
    result = _Substitute(variable, name, by_field).visit(copy.deepcopy(element))
    assert isinstance(result, ast.expr)
    return result
