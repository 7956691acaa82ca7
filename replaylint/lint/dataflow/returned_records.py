"""Fields of the records a policy function returns.

``self.dtypes = cache_dtypes(model_dtype, ssm_dtype)`` then ``dtype=self.dtypes.gate``: when
every ``return`` of ``cache_dtypes`` (a function or method of the module) builds a record
(``CacheDtypes(delta=ring_dtype, gate=GATE_DTYPE)``, a NamedTuple or dataclass of the module),
the gate ring's dtype is what each of them puts in the ``gate`` field. The record may be read
through a local bound once, or an attribute of ``self`` that the class's methods set only so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import records
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def returned_field_dtypes(
    prov: Provenance, attribute: cst.Attribute, site: Site
) -> tuple[DtypeFact, ...] | None:
    """The dtypes the field ``attribute.attr`` may hold, across every record the calls that
    made ``attribute.value`` may return; None when one of them is not known."""
    made = _calls(prov, attribute.value, site)
    if not made:
        return None
    facts: list[DtypeFact] = []
    for call, call_site in made:
        found = called_function(prov.index, prov, call, call_site)
        if found is None:
            return None
        function, scopes, _ = found
        returns = prov.index.scope(function).returns
        if not returns:
            return None
        for returned, statement in returns:
            if returned.value is None:
                return None
            held = records.field_value(
                prov, returned.value, attribute.attr.value, Site(scopes, statement), {}
            )
            if held is None:
                return None
            facts.extend(prov.dtype_facts(held.value, held.site))
    return tuple(facts) or None


def _calls(
    prov: Provenance, record: cst.BaseExpression, site: Site
) -> list[tuple[cst.Call, Site]] | None:
    """The calls ``record`` (a local, or ``self.<name>``) is bound to; None when it may be
    bound to anything else."""
    if isinstance(record, cst.Name):
        found = prov.lookup(record.value, site)
        values = [(b.value, at) for b, at in found or () if b.kind == "assign"]
        if not found or len(values) != len(found):
            return None
    elif (
        isinstance(record, cst.Attribute)
        and isinstance(record.value, cst.Name)
        and record.value.value == "self"
        and (owner := site.enclosing_class()) is not None
    ):
        values = list(instance_values(prov, owner, record.attr.value))
    else:
        return None
    calls = [(value, at) for value, at in values if isinstance(value, cst.Call)]
    return calls if calls and len(calls) == len(values) else None
