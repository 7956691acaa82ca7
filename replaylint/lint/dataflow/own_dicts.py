"""The dict a class keeps in one attribute of its instances: ``self.rings = {"d_cache": ...,
"g_cache": ...}``, its keys read where a method loops over ``self.rings.items()``.

The attribute must have one value in the class. A method that rebuilds it with the keys it had
(``self.rings = {k: v.to(device) for k, v in self.rings.items()}``, ``tree_map(fn, self.rings)``)
gives it no other keys and is not a second value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.tree_maps import tree_map_of
from replaylint.lint.syntax.nodes import method_name
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["own_dict"]


def own_dict(
    prov: Provenance, expr: cst.BaseExpression, site: Site
) -> tuple[cst.Dict | cst.DictComp, Site] | None:
    """The dict literal or comprehension a method of the enclosing class binds ``self.<name>``
    to, when that is the one value the class gives it (directly, or through a local of that
    method bound once)."""
    if not (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
    ):
        return None
    owner = site.enclosing_class()
    if owner is None:
        return None
    from replaylint.lint.dataflow.scalars import instance_values

    name = expr.attr.value
    values = [v for v in instance_values(prov, owner, name) if not _rebuilds(prov, v[0], name)]
    if len(values) != 1:
        return None
    value, where = values[0]
    if isinstance(value, cst.Name):
        found = prov.lookup(value.value, where)
        if not found or len(found) != 1 or found[0][0].value is None:
            return None
        value, where = found[0][0].value, found[0][1]
    return (value, where) if isinstance(value, (cst.Dict, cst.DictComp)) else None


def _rebuilds(prov: Provenance, value: cst.BaseExpression, name: str) -> bool:
    """Whether ``value`` rebuilds ``self.<name>`` with the keys it had: ``{k: v.to(device) for k,
    v in self.<name>.items()}`` or a library map over it (``tree_map(fn, self.<name>)``)."""
    mapped = tree_map_of(prov.index, value) if isinstance(value, cst.Call) else None
    if mapped is not None:
        return _is_own(mapped.tree, name)
    if not isinstance(value, cst.DictComp):
        return False
    loop = value.for_in
    iterated = loop.iter
    if loop.ifs or loop.inner_for_in is not None or not isinstance(iterated, cst.Call):
        return False
    method = method_name(iterated)
    if method not in {"items", "keys"} or not isinstance(iterated.func, cst.Attribute):
        return False
    key: cst.BaseExpression = loop.target
    if method == "items":
        if not (isinstance(key, cst.Tuple) and len(key.elements) == 2):
            return False
        key = key.elements[0].value
    return (
        _is_own(iterated.func.value, name)
        and isinstance(key, cst.Name)
        and isinstance(value.key, cst.Name)
        and value.key.value == key.value
    )


def _is_own(expr: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
        and expr.attr.value == name
    )
