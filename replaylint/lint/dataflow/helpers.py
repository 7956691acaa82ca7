"""Calls to functions defined in the same module: which definition a call reaches.

A helper called as ``_ring(shape, dtype)`` (a function of the module or an enclosing scope) or as
``self._ring(shape, dtype)`` (a method of the enclosing class) can be followed into its body, to
see which parameter reaches the allocation it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.syntax.nodes import decorated, dotted_name
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
        for cls in _with_bases(index, owner):
            method = own_method(index, cls, func.attr.value)
            if method is None:
                continue
            static = decorated(method, "staticmethod")
            if cls is owner:
                class_index = site.scopes.index(owner)
                return method, (*site.scopes[: class_index + 1], method), not static
            return method, (index.module, cls, method), not static  # inherited
        return None
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
        # `Attention(cfg).ring()`, `build_attention().ring()`: a method of the instance made
        made = _made_class(index, provenance, func.value, site)
        method = own_method(index, made, func.attr.value) if made is not None else None
        if method is None or decorated(method, "staticmethod"):
            return None
        assert made is not None
        return method, (index.module, made, method), True
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        owner = _class_of(index, provenance, func.value, site)
        if owner is None:
            return None
        for binding in index.scope(owner).bindings.get(func.attr.value, ()):
            if binding.kind == "definition" and isinstance(binding.node, cst.FunctionDef):
                decorators = {dotted_name(d.decorator) for d in binding.node.decorators}
                if "staticmethod" in decorators:
                    return binding.node, (index.module, owner, binding.node), False
                if (
                    owner is module_class(index, func.value.value)
                    and "classmethod" not in decorators
                ):
                    return None  # `Cache.rings(cache)`: the instance is an argument
                return binding.node, (index.module, owner, binding.node), True
    return None


def _class_of(
    index: ModuleIndex, provenance: Provenance, name: cst.Name, site: Site
) -> cst.ClassDef | None:
    """The module-level class ``name`` is (``Cache.make()``) or is an instance of: a parameter
    annotated with it (``cache: Cache``, ``"Cache"``) or a local bound once to ``Cache(...)``."""
    found = provenance.lookup(name.value, site) or []
    if len(found) != 1:
        return None
    binding = found[0][0]
    if binding.kind == "definition" and isinstance(binding.node, cst.ClassDef):
        return binding.node if binding.node in index.module.body else None
    if binding.kind == "param" and isinstance(binding.node, cst.Param):
        return module_class(index, _annotated_name(binding.node.annotation))
    if binding.kind == "assign" and isinstance(binding.value, cst.Call):
        return _made_class(index, provenance, binding.value, found[0][1])
    return None


def _annotated_name(annotation: cst.Annotation | None) -> str | None:
    """The class an annotation names, as written (``Cache``, ``"Cache"``, ``pkg.Cache``)."""
    node = annotation.annotation if annotation is not None else None
    text = node.evaluated_value if isinstance(node, cst.SimpleString) else None
    return text if isinstance(text, str) else (dotted_name(node) if node is not None else None)


def _made_class(
    index: ModuleIndex, provenance: Provenance, call: cst.Call, site: Site
) -> cst.ClassDef | None:
    """The module-level class of what ``call`` makes: ``Cls(...)``, or a call of a function of
    the module annotated to return ``Cls``."""
    made = module_class(index, dotted_name(call.func))
    if made is not None or not isinstance(call.func, cst.Name):
        return made
    for binding, _ in provenance.lookup(call.func.value, site) or ():
        function = binding.node
        if binding.kind == "definition" and isinstance(function, cst.FunctionDef):
            return module_class(index, _annotated_name(function.returns))
    return None


def own_method(index: ModuleIndex, owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    """The method ``name`` that ``owner``'s body defines."""
    for binding in index.scope(owner).bindings.get(name, ()):
        if binding.kind == "definition" and isinstance(binding.node, cst.FunctionDef):
            return binding.node
    return None


def _with_bases(index: ModuleIndex, owner: cst.ClassDef) -> list[cst.ClassDef]:
    """``owner``, then the classes of the module it derives from, nearest first (a method
    ``self`` calls may be inherited)."""
    order: list[cst.ClassDef] = []
    pending = [owner]
    while pending and len(order) < _MAX_BASES:
        cls = pending.pop(0)
        if any(cls is seen for seen in order):
            continue
        order.append(cls)
        for base in cls.bases:
            found = module_class(index, dotted_name(base.value))
            if found is not None:
                pending.append(found)
    return order


_MAX_BASES = 8


def module_class(index: ModuleIndex, name: str | None) -> cst.ClassDef | None:
    """The class of the module's top level named ``name``."""
    for statement in index.module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            return statement
    return None
