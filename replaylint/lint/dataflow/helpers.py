"""Calls to functions defined in the same module: which definition a call reaches.

A helper called as ``_ring(shape, dtype)`` (a function of the module or an enclosing scope) or as
``self._ring(shape, dtype)`` (a method of the enclosing class) can be followed into its body, to
see which parameter reaches the allocation it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.syntax.sites import ScopeNode, Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

CalledFunction = tuple[cst.FunctionDef, tuple[ScopeNode, ...], bool]
"""The definition, the scopes its body is evaluated in, and whether it is bound (a method
called on ``self`` whose first parameter is not passed)."""


def called_function(
    index: ModuleIndex, provenance: Provenance, call: cst.Call, site: Site
) -> CalledFunction | None:
    """The module's definition that ``call`` at ``site`` runs, when it is one we can read."""
    func = call.func
    if isinstance(func, cst.Name):
        for binding, binding_site in provenance.lookup(func.value, site) or ():
            if binding.kind == "definition" and isinstance(binding.node, cst.FunctionDef):
                return binding.node, (*binding_site.scopes, binding.node), False
        return None
    if (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and func.value.value in {"self", "cls"}
    ):
        owner = site.enclosing_class()
        if owner is None:
            return None
        for binding in index.scope(owner).bindings.get(func.attr.value, ()):
            if binding.kind == "definition" and isinstance(binding.node, cst.FunctionDef):
                static = any(
                    isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
                    for d in binding.node.decorators
                )
                class_index = site.scopes.index(owner)
                return binding.node, (*site.scopes[: class_index + 1], binding.node), not static
    return None
