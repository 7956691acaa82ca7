"""Which methods may have run on a model a scope makes and hands on before it casts it: those the
scope calls on it, ``forward`` when the scope calls it, and every method name that the project
callees it is passed to call (their own statement, for a class or function of this module;
their module's text, for one of another project module). A callee outside the project may run
anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.instances import chain_root
from replaylint.lint.dataflow.new_instances import hand_offs, methods_called
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["ClassOf", "methods_run_elsewhere"]

ClassOf = Callable[["Provenance", cst.BaseExpression, Site], "Found | None"]
"""The project class an expression denotes."""


def methods_run_elsewhere(
    prov: Provenance, receiver: cst.BaseExpression, site: Site, class_of: ClassOf
) -> frozenset[str] | None:
    """The methods that may have run on ``receiver``, made in this scope and handed on before
    ``site``: those the scope calls on it, ``forward`` when the scope calls it, and every method
    name that the modules of the project callees it is passed to call (``ExLlamaGenerator(model,
    cache)`` of a module that never calls ``.attach_caches(``); None when a callee is not of
    the project."""
    if prov.project is None or not isinstance(chain_root(receiver), cst.Name):
        return None
    called = set(methods_called(receiver, site))
    for call, called_itself in hand_offs(receiver, site):
        if called_itself:
            called |= {"forward", "__call__"}
            continue
        methods = _methods_callee_calls(prov, call.func, site, class_of)
        if methods is None:
            return None
        called |= methods
    return frozenset(called)


def _methods_callee_calls(
    prov: Provenance, func: cst.BaseExpression, site: Site, class_of: ClassOf
) -> frozenset[str] | None:
    """The method names the class or function ``func`` denotes may call: those its own
    statement calls, for one of this module; those its module calls, for one of another
    project module; None for any other callee."""
    assert prov.project is not None
    if isinstance(func, cst.Name):
        bound = prov.lookup(func.value, site) or []
        if len(bound) == 1 and bound[0][0].kind == "definition":
            return frozenset(
                node.func.attr.value
                for node in descendants(bound[0][0].statement)
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            )
    module = _callee_module(prov, func, site, class_of)
    return None if module is None else prov.project.index.methods_called_in(module)


def _callee_module(
    prov: Provenance, func: cst.BaseExpression, site: Site, class_of: ClassOf
) -> str | None:
    """The project module that defines the class or function ``func`` denotes."""
    assert prov.project is not None
    found = class_of(prov, func, site)
    if found is not None:
        return found.module
    value = as_value(prov, func, site, NO_ENV)
    if value is not None and value[0] == "ref":
        target = prov.project.resolve(str(value[2]))
        if isinstance(target, Found) and target.definition[0] == "function":
            return target.module
    return None
