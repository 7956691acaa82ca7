"""Modules handed a gate-buffer submodule after they are made.

``draft = load_model(path); draft.replay_cache = ReplayCache(...)``: whatever class ``draft`` is
of, from then on it holds the cache's gate buffer, and ``draft.half()`` converts it.
:func:`given_gate_holder` finds such an assignment to an attribute of a cast's receiver (a name,
or ``self.<name>``) in the function that casts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.imported_modules import imported_gate_buffer
from replaylint.lint.dataflow.instances import instance_classes
from replaylint.lint.dataflow.module_classes import module_classes
from replaylint.lint.dataflow.modules import gate_buffer_classes
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


@dataclass(frozen=True)
class GivenHolder:
    """``<receiver>.<attribute> = <cls>(...)``, where ``cls`` holds the gate buffer ``buffer``."""

    assignment: cst.Assign
    attribute: str
    cls: str
    buffer: str
    registered: cst.CSTNode | str
    """Where ``buffer`` is registered: a node of this module, or ``path:line`` of another."""


def given_gate_holder(
    prov: Provenance, receiver: cst.BaseExpression, site: Site
) -> GivenHolder | None:
    """The assignment ``<receiver>.<attr> = GateHolder(...)`` in the function of ``site``, when
    its value is an instance of a class of the module or of the project that holds a gate
    buffer."""
    function = site.scope
    if not isinstance(receiver, (cst.Name, cst.Attribute)) or not isinstance(
        function, cst.FunctionDef
    ):
        return None
    written = prov.index.module.code_for_node(receiver)
    for node in descendants(function.body):
        if not isinstance(node, cst.SimpleStatementLine):
            continue
        for small in node.body:
            if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)):
                continue
            for target in small.targets:
                attribute = target.target
                if not (
                    isinstance(attribute, cst.Attribute)
                    and prov.index.module.code_for_node(attribute.value) == written
                ):
                    continue
                given = _holder(prov, small, attribute.attr.value, Site(site.scopes, node))
                if given is not None:
                    return given
    return None


def _holder(prov: Provenance, assign: cst.Assign, attribute: str, site: Site) -> GivenHolder | None:
    value = assign.value
    imported = imported_gate_buffer(prov, value, site)
    if imported is not None:
        where = f"{imported.origin.path}:{imported.origin.line}"
        return GivenHolder(assign, attribute, imported.cls, imported.name, where)
    holders = gate_buffer_classes(prov)
    made = instance_classes(prov, module_classes(prov), value, site) if holders else None
    if not made or any(name not in holders for name in made):
        return None
    buffer = holders[made[0]]
    return GivenHolder(assign, attribute, made[0], buffer.name, buffer.node)
