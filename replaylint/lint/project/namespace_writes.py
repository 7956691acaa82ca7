"""Whether ``setattr(x, name, value)`` may write a name of a module: the question behind a
summary's ``writes_names`` (a module whose names may change at run time is not read for them).

Only what may be a module object counts: a name bound by an import or to ``import_module(...)``,
an attribute or item of one (``sys.modules[__name__]``), or what a call returns. A loop variable
or a local object (``setattr(rings, name, t)``) and ``self`` or ``cls`` are not.
"""

from __future__ import annotations

import ast

from replaylint.lint.project.module_facts import dotted

_IMPORTING = frozenset({"import_module", "__import__"})


def may_be_module(node: ast.expr, modules: set[str]) -> bool:
    """Whether ``node`` may be a module object: a name imported or bound to one, an attribute
    or item of one (``sys.modules[...]``), or what a call returns."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return not isinstance(node, ast.Name) or node.id in modules


def imports_module(value: ast.expr) -> bool:
    """``importlib.import_module(name)``, ``__import__(name)``, ``sys.modules[name]``."""
    if isinstance(value, ast.Call):
        called = dotted(value.func)
        return called == "sys.modules.get" or called.rpartition(".")[2] in _IMPORTING
    return isinstance(value, ast.Subscript) and dotted(value.value) == "sys.modules"


def instance_setattr(receiver: ast.expr, call: ast.Call) -> bool:
    """``super().__setattr__(name, v)``, ``object.__setattr__(self, name, v)``,
    ``self.__setattr__(name, v)``: an instance's attribute, never a name of a module."""
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name):
        return receiver.func.id == "super"
    if is_instance(receiver):
        return True
    return (
        isinstance(receiver, ast.Name)
        and receiver.id == "object"
        and bool(call.args)
        and is_instance(call.args[0])
    )


def is_instance(node: ast.expr) -> bool:
    """``self`` or ``cls``: ``setattr(self, name, v)`` sets an attribute of an instance or
    class, never a name of a module."""
    return isinstance(node, ast.Name) and node.id in {"self", "cls"}
