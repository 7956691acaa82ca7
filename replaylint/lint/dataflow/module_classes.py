"""The module's classes, and what their methods put into attributes of the instance.

:func:`module_classes` finds the classes of a module once, each with the scopes its body is
evaluated in; :func:`attribute_values` lists what a class's methods assign to attributes of
``self`` (``self.x = ...``, ``add_module``, ``setattr``, ``self.layers.append(...)``), base classes
of the module included. Both questions of :mod:`.instances` start from these.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.syntax.nodes import (
    decorated,
    dotted_name,
    is_name,
    literal_string,
    plain_elements,
    positional_args,
)
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

# calls that add their (last) argument to a list, dict or container module
ADDING_METHODS = frozenset({"append", "extend", "insert", "update", "add_module"})
_NOT_MODULE_BASES = frozenset(
    {"object", "ABC", "abc.ABC", "Protocol", "typing.Protocol", "NamedTuple", "typing.NamedTuple"}
    | {"Enum", "enum.Enum", "IntEnum", "enum.IntEnum", "TypedDict", "typing.TypedDict"}
)

Names = tuple[str, ...]


@dataclass(frozen=True)
class ModuleClasses:
    """The module's classes by name, each with the scopes its body is evaluated in."""

    by_name: dict[str, cst.ClassDef]
    scopes: dict[int, tuple[ScopeNode, ...]]
    """``id(cls)`` -> the scopes of its body, ``cls`` last."""

    def mro(self, cls: cst.ClassDef) -> list[cst.ClassDef]:
        """``cls`` and its base classes of the module, nearest first."""
        order: list[cst.ClassDef] = []
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if any(current is seen for seen in order):
                continue
            order.append(current)
            for base in current.bases:
                base_class = self.by_name.get(dotted_name(base.value) or "")
                if base_class is not None:
                    stack.append(base_class)
        return order

    def family(self, cls: cst.ClassDef) -> tuple[str, ...]:
        """``cls`` and its subclasses of the module: what ``self`` or ``cls`` may be in its
        methods."""
        return tuple(
            name for name, other in self.by_name.items() if any(cls is c for c in self.mro(other))
        )

    def is_module(self, cls: cst.ClassDef) -> bool:
        """Whether ``cls`` may be an ``nn.Module``: it has a base that is not plainly something
        else (``object``, ``ABC``, ``Protocol``, an enum), of the module or imported."""
        for owner in self.mro(cls):
            for base in owner.bases:
                name = dotted_name(base.value)
                if name is not None and name not in _NOT_MODULE_BASES and name not in self.by_name:
                    return True
        return False


def module_classes(prov: Provenance) -> ModuleClasses:
    """The module's classes, found once per module."""
    key = ("module_classes", 0)
    found = prov.index.memo.get(key)
    if found is None:
        found = prov.index.memo[key] = _module_classes(prov)
    assert isinstance(found, ModuleClasses)
    return found


def _module_classes(prov: Provenance) -> ModuleClasses:
    by_name: dict[str, cst.ClassDef] = {}
    scopes: dict[int, tuple[ScopeNode, ...]] = {}
    stack: list[tuple[cst.CSTNode, tuple[ScopeNode, ...]]] = [(prov.index.module, ())]
    while stack:
        node, outer = stack.pop()
        if isinstance(node, (cst.Module, cst.FunctionDef, cst.ClassDef)):
            outer = (*outer, node)
            if isinstance(node, cst.ClassDef):
                by_name.setdefault(node.name.value, node)
                scopes[id(node)] = outer
        if not isinstance(node, cst.SimpleStatementLine):  # a class is a statement of a block
            stack.extend(
                (child, outer)
                for child in reversed(syntax_children(node))
                if isinstance(child, _HOLDS_STATEMENTS)
            )
    return ModuleClasses(by_name, scopes)


# what may hold a class statement: compound statements, their blocks and clauses
_HOLDS_STATEMENTS = (
    cst.BaseStatement,
    cst.BaseSuite,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)


# ---------------------------------------------------------------- what a class's methods assign
def attribute_values(
    classes: ModuleClasses, cls: cst.ClassDef
) -> Iterator[tuple[str, cst.BaseExpression, Site]]:
    """``(attribute, value, site)`` for each value ``cls``'s methods (or its module bases')
    put into an attribute of the instance."""
    for owner in classes.mro(cls):
        for statement in owner.body.body:
            if not isinstance(statement, cst.FunctionDef) or is_static(statement):
                continue
            if decorated(statement, "classmethod"):
                continue  # `cls.x = ...` sets the class, not an instance
            params = statement.params.params or statement.params.posonly_params
            if not params:
                continue
            me = params[0].name.value
            scopes = (*classes.scopes[id(owner)], statement)
            for line in _simple_statements(statement.body):
                site = Site(scopes, line)
                for small in line.body:
                    for attribute, value in _assigned(small, me):
                        yield attribute, value, site


def _assigned(small: cst.BaseSmallStatement, me: str) -> Iterator[tuple[str, cst.BaseExpression]]:
    if isinstance(small, cst.Assign):
        for target in small.targets:
            attribute = _own_attribute(target.target, me)
            if attribute is not None:
                yield attribute, small.value
            elif isinstance(target.target, (cst.Tuple, cst.List)):  # `self.a, self.b = a, b`
                value = small.value
                values = plain_elements(value) if isinstance(value, (cst.Tuple, cst.List)) else None
                names = plain_elements(target.target)
                if values is not None and names is not None and len(values) == len(names):
                    for name, element in zip(names, values, strict=True):
                        attribute = _own_attribute(name, me)
                        if attribute is not None:
                            yield attribute, element
    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and small.value is not None:
        attribute = _own_attribute(small.target, me)
        if attribute is not None:
            yield attribute, small.value
    elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        call = small.value
        args = positional_args(call)
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and is_name(func.value, me)
            and func.attr.value in {"add_module", "register_module"}
            and len(args) >= 2
        ):
            yield _attribute_text(args[0].value), args[1].value
        elif is_name(func, "setattr") and len(args) >= 3 and is_name(args[0].value, me):
            yield _attribute_text(args[1].value), args[2].value
        elif (
            isinstance(func, cst.Attribute)
            and func.attr.value in ADDING_METHODS
            and args
            and _own_attribute(func.value, me) is not None
        ):
            yield _own_attribute(func.value, me) or "", args[-1].value


def _own_attribute(target: cst.BaseExpression, me: str) -> str | None:
    """``x`` of ``self.x`` or ``self.x[key]``."""
    if isinstance(target, cst.Subscript):
        target = target.value
    if isinstance(target, cst.Attribute) and is_name(target.value, me):
        return target.attr.value
    return None


def _attribute_text(name: cst.BaseExpression) -> str:
    """An attribute name as written: ``layers``, ``layer{i}`` (an f-string), ``{name}``."""
    literal = literal_string(name)
    if literal is not None:
        return literal
    if isinstance(name, cst.FormattedString):
        module = cst.Module(body=[])
        return "".join(
            part.value
            if isinstance(part, cst.FormattedStringText)
            else "{" + module.code_for_node(part.expression) + "}"
            if isinstance(part, cst.FormattedStringExpression)
            else ""
            for part in name.parts
        )
    return "{" + cst.Module(body=[]).code_for_node(name) + "}"


def _simple_statements(
    node: cst.CSTNode,
) -> Iterator[cst.SimpleStatementLine | cst.SimpleStatementSuite]:
    """The simple statements of a body, in nested blocks too, not in nested definitions."""
    for child in syntax_children(node):
        if isinstance(child, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield child
        elif not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.BaseExpression)):
            yield from _simple_statements(child)


def is_static(function: cst.FunctionDef) -> bool:
    """Whether ``function`` is a ``@staticmethod``."""
    return decorated(function, "staticmethod")
