"""The attributes a class's methods keep on ``self``, by name, for its class summary.

An importer that sees an instance restored entry by entry (``setattr(pool, name, t)`` for every
entry of a loaded mapping) asks which of these name a gate cache: those are the attributes the
loop may replace. The names are what the class's own text spells: ``self.g_cache`` read or
written, ``register_buffer("g_cache", ...)`` and ``setattr(self, "g_cache", ...)``; attributes
set under computed names are not listed. The module's summary also lists the attributes that hold
lists (:func:`list_attribute`).
"""

from __future__ import annotations

import ast

from replaylint.lint.project.module_facts import dotted

__all__ = ["list_attribute", "self_attributes"]

_MAX_ATTRIBUTES = 256  # a class with more is no cache: the rest are left out
_NAMING_CALLS = frozenset({"register_buffer", "register_parameter", "add_module"})


def self_attributes(cls: ast.ClassDef) -> list[str]:
    """The sorted attribute names the methods of ``cls`` spell on their first parameter (a
    method called on it, ``self.reset()``, is none)."""
    names: set[str] = set()
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        owner = method.args.args[0].arg
        nodes = list(ast.walk(method))
        called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
        for node in nodes:
            if (
                isinstance(node, ast.Attribute)
                and _is(node.value, owner)
                and id(node) not in called
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Call) and node.args:
                named = _named_by_call(node, owner)
                if named is not None:
                    names.add(named)
    return sorted(names)[:_MAX_ATTRIBUTES]


def list_attribute(node: ast.AST) -> str | None:
    """``x`` of ``self.x = [...]``, ``self.x: list[T] = ...``, ``self.x.append(...)``: an
    attribute that holds a list."""
    target: ast.expr | None = None
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        if isinstance(node.value, (ast.List, ast.ListComp)):
            target = node.targets[0]
    elif isinstance(node, ast.AnnAssign):
        annotation = node.annotation
        written = dotted(annotation.value if isinstance(annotation, ast.Subscript) else annotation)
        if written in {"list", "List", "typing.List"} or isinstance(
            node.value, (ast.List, ast.ListComp)
        ):
            target = node.target
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"append", "insert", "extend"}
    ):
        target = node.func.value
    if isinstance(target, ast.Attribute) and _is(target.value, "self"):
        return target.attr
    return None


def _named_by_call(call: ast.Call, owner: str) -> str | None:
    """``"g_cache"`` of ``self.register_buffer("g_cache", ...)`` or ``setattr(self, "g_cache", ...)``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _NAMING_CALLS and _is(func.value, owner):
        first: ast.expr = call.args[0]
    elif isinstance(func, ast.Name) and func.id == "setattr" and len(call.args) == 3:
        if not _is(call.args[0], owner):
            return None
        first = call.args[1]
    else:
        return None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _is(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
