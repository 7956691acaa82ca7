"""Weights of a class that a function of another module of the project widens to float32.

``G = _log_decay(a, self.A_log, self.dt_bias)`` with ``_log_decay`` imported from a kernel module
that does ``A_log.float()``: the class's own code expects ``self.A_log`` in another dtype at run
time, as when one of its methods casts it itself (:meth:`ModuleIndex.upcast_attributes`). The
defining module's summary lists the parameters its functions widen
(:mod:`replaylint.lint.project.widening`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.imported import MALFORMED
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def imported_upcasts(prov: Provenance, cls: cst.ClassDef) -> frozenset[str]:
    """Attributes of ``self`` that ``cls`` passes to a project function of another module in a
    place that function widens to float32."""
    if prov.project is None:
        return frozenset()
    key = ("imported_upcasts", id(cls))
    known = prov.index.memo.get(key)
    if known is None:
        known = prov.index.memo[key] = frozenset(_passed_widened(prov, cls))
    assert isinstance(known, frozenset)
    return known


def _passed_widened(prov: Provenance, cls: cst.ClassDef) -> set[str]:
    found: set[str] = set()
    site = Site((prov.index.module, cls), None)
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for method in body:
        if not isinstance(method, cst.FunctionDef):
            continue
        views: dict[str, str] | None = None
        for node in descendants(method.body):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
                continue
            passed: list[tuple[str | int, str]] = []
            for position, arg in enumerate(node.args):
                attribute = _own_attribute(arg.value)
                if attribute is None and isinstance(arg.value, cst.Name):
                    if views is None:
                        views = _local_views(method)
                    attribute = views.get(arg.value.value)
                if attribute is not None:
                    passed.append((arg.keyword.value if arg.keyword else position, attribute))
            if not passed:
                continue
            widened = _widened_by(prov, node.func, site)
            for place, attribute in passed:
                if place in widened:
                    found.add(attribute)
    return found


_VIEWS = frozenset({"view", "reshape", "unsqueeze", "squeeze", "flatten", "contiguous", "t"})


def _own_attribute(expr: cst.BaseExpression) -> str | None:
    """``x`` of ``self.x``, of a view of it (``self.x.reshape(h, k)``) or of an index of it."""
    while True:
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value in _VIEWS
        ):
            expr = expr.func.value
        else:
            break
    if (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
    ):
        return expr.attr.value
    return None


def _local_views(method: cst.FunctionDef) -> dict[str, str]:
    """Locals of ``method`` assigned only views of one attribute of ``self``
    (``dt_bias = self.dt_bias.reshape(hv, k)``), by name."""
    views: dict[str, str] = {}
    spoiled: set[str] = set()
    for node in descendants(method.body):
        if not isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            continue
        targets = (
            [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        )
        attribute = _own_attribute(node.value) if isinstance(node, cst.Assign) else None
        for target in targets:
            if not isinstance(target, cst.Name):
                continue
            name = target.value
            if attribute is None or views.get(name, attribute) != attribute:
                spoiled.add(name)
            else:
                views[name] = attribute
    return {name: attribute for name, attribute in views.items() if name not in spoiled}


def _widened_by(prov: Provenance, func: cst.Name, site: Site) -> set[str | int]:
    """The places (names and positions) the imported function ``func`` widens."""
    assert prov.project is not None
    try:
        value = as_value(prov, func, site, NO_ENV)
    except MALFORMED:
        return set()
    if value is None or value[0] != "ref":
        return set()
    target = prov.project.resolve(str(value[2]))
    if not isinstance(target, Found) or target.definition[0] != "function":
        return set()
    summary = prov.project.index.summary(target.module)
    names = set((summary or {}).get("widens", {}).get(target.name, ()))
    if not names:
        return set()
    params = [p for p in target.definition[2] if isinstance(p, list) and p[1] == "pos"]
    places: set[str | int] = set(names)
    places.update(i for i, p in enumerate(params) if p[0] in names)
    return places
