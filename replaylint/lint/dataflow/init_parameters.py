"""Gate-dtype settings that hold what the constructor was given: ``self.decay_dtype =
decay_dtype``.

An allocation inside the class reads ``self.decay_dtype``, a setting named for the gate's dtype;
the class sets it once, in ``__init__``, from a parameter and never again. The attribute then holds exactly what
the parameter holds, so it has the parameter's dtypes: its default where no call passes it, and
what each construction of the class passes (``Cache(shape, decay_dtype=...)``, ``cls(...)`` in a
class method), judged as a parameter's are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.syntax.nodes import is_name
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["constructor_parameter"]


def constructor_parameter(
    prov: Provenance, attribute: cst.Attribute, site: Site
) -> tuple[cst.Name, Site] | None:
    """The parameter of ``__init__`` that ``self.<name>`` holds, and the site where it is
    assigned; None when the attribute is set anywhere else, or from anything else."""
    owner = site.enclosing_class()
    if owner is None or not is_name(attribute.value, "self"):
        return None
    name = attribute.attr.value
    if not prov.index.gate_caches.names_gate_dtype(name):
        return None  # `self.dtype` of a pool: the allocation that reads it is judged itself
    given = list(instance_values(prov, owner, name))
    if len(given) != 1:
        return None
    value, where = given[0]
    method = where.scope
    if not (
        isinstance(value, cst.Name)
        and isinstance(method, cst.FunctionDef)
        and method.name.value == "__init__"
    ):
        return None
    found = prov.lookup(value.value, where)
    if not found or any(binding.kind != "param" for binding, _ in found):
        return None  # rebound before the assignment, or no parameter
    if prov.index.assigns_attribute_not_on_self(name):
        return None  # `cache.decay_dtype = ...` elsewhere: it may hold another value
    return value, where
