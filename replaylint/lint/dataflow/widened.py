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
    for node in descendants(cls.body):
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
            continue
        passed = [
            (arg.keyword.value if arg.keyword is not None else place, arg.value.attr.value)
            for place, arg in enumerate(node.args)
            if isinstance(arg.value, cst.Attribute)
            and isinstance(arg.value.value, cst.Name)
            and arg.value.value.value == "self"
        ]
        if not passed:
            continue
        widened = _widened_by(prov, node.func, site)
        for place, attribute in passed:
            if place in widened:
                found.add(attribute)
    return found


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
