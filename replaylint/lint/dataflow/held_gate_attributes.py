"""The gate caches an object holds by attribute, read from the project class it is an instance of.

``setattr(self.pool, name, t)`` for every entry of a mapping names no ring; whether it may replace
a gate cache depends on what ``self.pool`` is. When the analysis knows its class (a class of this
module, :func:`.instances.instance_classes`, or of another module of the project,
:func:`.imported_modules.imported_class`), the attributes that class and its bases spell on
``self`` (for another module's, its summary lists them) and that name a gate cache are the ones
the call may replace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.imported_modules import imported_class
from replaylint.lint.dataflow.instances import instance_classes
from replaylint.lint.dataflow.module_classes import module_classes
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.project.gate_buffers import with_bases
from replaylint.lint.syntax.nodes import is_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["gate_attributes_spelled", "held_gate_attributes"]


def held_gate_attributes(
    prov: Provenance, names: GateCacheNames, holder: cst.BaseExpression, site: Site
) -> set[str]:
    """The attributes naming a gate cache that the class of ``holder`` keeps on its instances;
    empty when the class is not known."""
    held: set[str] = set()
    classes = module_classes(prov)
    for name in instance_classes(prov, classes, holder, site) or ():
        for own in classes.mro(classes.by_name[name]):  # a class of this module
            held |= gate_attributes_spelled(own, "self", names)
    if held or prov.project is None:
        return held
    found = imported_class(prov, holder, site)
    if found is None:
        return held
    for cls in with_bases(prov.project.index, found):
        flags = cls.definition[3] if cls.definition[0] == "class" else {}
        for attribute in flags.get("attributes", ()) if isinstance(flags, dict) else ():
            if isinstance(attribute, str) and names.matches(attribute):
                held.add(attribute)
    return held


def gate_attributes_spelled(scope: cst.CSTNode, owner: str, names: GateCacheNames) -> set[str]:
    """The attributes ``<owner>.<name>`` that ``scope`` spells and that name a gate cache."""
    return {
        node.attr.value
        for node in descendants(scope)
        if isinstance(node, cst.Attribute)
        and is_name(node.value, owner)
        and names.matches(node.attr.value)
    }
