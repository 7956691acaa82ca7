"""The field names of a project record class as strings: what a loop over ``Rings._fields`` or
``state._asdict()`` iterates over (:mod:`.strings` reads them as literal collections)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import method_name
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def record_fields_named(prov: Provenance, expr: cst.BaseExpression, site: Site) -> list[str] | None:
    """The field names ``Record._fields`` lists, for a record class of the project."""
    if not (isinstance(expr, cst.Attribute) and expr.attr.value == "_fields"):
        return None
    return _field_names(prov, expr.value, site)


def asdict_fields(prov: Provenance, expr: cst.BaseExpression, site: Site) -> list[str] | None:
    """The field names of ``record._asdict()``, for a parameter annotated with a record class
    of the project (``def __init__(self, state: Rings)``)."""
    if not (
        isinstance(expr, cst.Call)
        and method_name(expr) == "_asdict"
        and not expr.args
        and isinstance(expr.func, cst.Attribute)
        and isinstance(expr.func.value, cst.Name)
    ):
        return None
    found = prov.lookup(expr.func.value.value, site)
    if not found or len(found) != 1 or found[0][0].kind != "param":
        return None
    param = found[0][0].node
    if not isinstance(param, cst.Param) or param.annotation is None:
        return None
    return _field_names(prov, param.annotation.annotation, site)


def _field_names(prov: Provenance, cls: cst.BaseExpression, site: Site) -> list[str] | None:
    """The positional fields of the project's record class ``cls`` names."""
    from replaylint.lint.dataflow.records import positional_fields  # records reads strings

    fields = positional_fields(prov, cst.Call(func=cls), site)
    return None if fields is None else [name for name, _ in fields]


def imported_record_requires(prov: Provenance, qualified: str, field: str) -> bool:
    """Whether ``qualified`` (a dotted name as the module imports it) is a record class of
    another module of the project that declares ``field`` without a default."""
    project = prov.project
    if project is None:
        return False
    found = project.resolve(qualified)
    if not isinstance(found, Found) or found.definition[0] != "class":
        return False
    members, flags = found.definition[2], found.definition[3]
    member = members.get(field) if isinstance(members, dict) else None
    return bool(flags.get("record")) and isinstance(member, list) and member[2:3] == [["required"]]
