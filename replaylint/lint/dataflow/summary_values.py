"""Expressions of the module under analysis as values of the summaries' tiny language
(:mod:`replaylint.lint.project.summaries`): names imported from the project, attributes, calls
and subscripts of them, and instances of project classes held by locals, parameters and
attributes of ``self``. :mod:`replaylint.lint.dataflow.imported` evaluates them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.kwargs import table_call
from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.annotations import annotated_name
from replaylint.lint.syntax.nodes import positional_args, self_attribute
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


@dataclass(frozen=True)
class Here:
    """An argument written in the module under analysis."""

    expr: cst.BaseExpression
    site: Site
    env: Env


def as_value(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> Value | None:
    """``expr`` of the module under analysis as a summary value over its imports: imported
    names and attributes of them, calls of them and subscripts of them; None otherwise."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        if isinstance(expr, cst.Name) and not _imported_here(prov, expr, site, env):
            return None
        names = prov.index.imported_names(expr)
        if len(names) == 1:
            return ["ref", "", next(iter(names))]
        if isinstance(expr, cst.Attribute):
            base = _receiver(prov, expr.value, site, env)
            if base is not None:
                return ["attr", base, expr.attr.value]
        return None
    if isinstance(expr, cst.Call):
        callee = as_value(prov, expr.func, site, env)
        if callee is None and isinstance(expr.func, cst.Attribute):
            held = _held_instance(prov, expr.func.value, site)  # `self.model_args.ring_shapes()`
            callee = None if held is None else ["attr", held, expr.func.attr.value]
        if callee is None or any(arg.star for arg in expr.args):
            return None
        args = [["__here__", Here(a.value, site, env)] for a in positional_args(expr)]
        keywords = [
            [a.keyword.value, ["__here__", Here(a.value, site, env)]]
            for a in expr.args
            if a.keyword is not None
        ]
        return ["call", callee, args, keywords]
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        index = expr.slice[0].slice
        if not isinstance(index, cst.Index):
            return None
        table = as_value(prov, expr.value, site, env)
        if table is None and isinstance(expr.value, cst.Name):
            table = _returned_table(prov, expr.value, index.value, site, env)
        if table is None:
            return None
        return ["item", table, ["__here__", Here(index.value, site, env)]]
    return None


def _returned_table(
    prov: Provenance, name: cst.Name, key: cst.BaseExpression, site: Site, env: Env
) -> Value | None:
    """``dtypes = ring_dtypes(dtype)`` bound once to a call of a project function, whose entry
    ``key`` the scope never writes afterwards: the call, for ``dtypes["g_cache"]``."""
    wanted = prov.string_value(key, site, env)
    bound = None if wanted is None else table_call(prov, name, wanted, site, env)
    return None if bound is None else as_value(prov, bound[0], bound[1], env)


def _receiver(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env, depth: int = 0
) -> Value | None:
    """An instance of a project class: ``CacheConfig()``, or a local or parameter annotated
    with or bound to one (``cfg: CacheConfig``, ``cfg = CacheConfig()``, ``cfg = self.cfg``),
    or ``given or CacheConfig(...)`` with ``given: CacheConfig | None``."""
    if depth > _MAX_RECEIVER_DEPTH:
        return None
    if isinstance(expr, cst.Call):
        return as_value(prov, expr, site, env)
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
        return _either_instance(prov, expr, site, env, depth)
    if self_attribute(expr) and (owner := site.enclosing_class()) is not None:
        assert isinstance(expr, cst.Attribute)  # `self.dtypes = cache_dtypes(...)`, set once
        values = list(instance_values(prov, owner, expr.attr.value))
        if len(values) != 1:
            return None
        reading: set[tuple[int, str]] = prov.index.memo.setdefault(_READING, set())
        key = (id(owner), expr.attr.value)
        if key in reading:
            return None  # `self.x = self.x.float()`, or a cycle through other attributes
        reading.add(key)
        try:
            value, where = values[0]
            made = _receiver(prov, value, where, env, depth + 1)
        finally:
            reading.discard(key)
        return _bound(made)
    if not isinstance(expr, cst.Name):
        return None
    found = prov.lookup(expr.value, site, env)
    if not found or len(found) != 1:
        return None
    binding, binding_site = found[0]
    if binding.kind == "assign" and binding.value is not None:
        made = _receiver(prov, binding.value, binding_site, env, depth + 1)
        return _bound(made)
    node = binding.node
    if binding.kind == "param" and isinstance(node, cst.Param) and node.annotation is not None:
        annotation = annotated_name(node.annotation)  # `RingDtypes | None`: a RingDtypes
        cls = None if annotation is None else as_value(prov, annotation, binding_site, env)
        return None if cls is None else ["__instance__", cls]
    return None


_MAX_RECEIVER_DEPTH = 6


def _bound(made: Value | None) -> Value | None:
    """A local or attribute bound to ``made``: a construction is remembered as made earlier."""
    if made is None:
        return None
    return ["__bound__", made] if made[0] == "call" else made


def _either_instance(
    prov: Provenance, expr: cst.BooleanOperation, site: Site, env: Env, depth: int
) -> Value | None:
    """``given or RingDtypes(...)``: an instance of one class either way, built elsewhere (its
    fields' defaults vouch only for float32)."""
    classes: list[Value] = []
    for operand in (expr.left, expr.right):
        made = _receiver(prov, operand, site, env, depth + 1)
        if made is None:
            return None
        if made[0] == "__bound__":
            made = made[1]
        if made[0] not in {"call", "__instance__"}:
            return None
        classes.append(made[1])
    return ["__instance__", classes[0]] if all(c == classes[0] for c in classes) else None


def _held_instance(prov: Provenance, expr: cst.BaseExpression, site: Site) -> Value | None:
    """``self.model_args``, a loop variable over ``model.layers``: an instance of a project
    class that :mod:`.imported_modules` can tell."""
    from replaylint.lint.dataflow.imported_modules import imported_class

    found = imported_class(prov, expr, site)
    return None if found is None else ["__instance__", ["__there__", found]]


def _imported_here(prov: Provenance, expr: cst.Name, site: Site, env: Env) -> bool:
    """Whether ``expr`` reads an import (not a local that shadows it)."""
    found = prov.lookup(expr.value, site, env)
    return bool(found) and all(binding.kind == "import" for binding, _ in found)  # type: ignore[union-attr]


_READING = ("attributes of self being read", 0)
