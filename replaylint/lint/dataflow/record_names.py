"""The field names of a project record class as strings: what a loop over ``Rings._fields`` or
``state._asdict()`` iterates over (:mod:`.strings` reads them as literal collections)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.torch_api import dtype_from_qualified_name
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.annotations import annotated_name
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
    """The field names of ``record._asdict()``, for a parameter or a local annotated with a
    record class of the project (``def __init__(self, state: Rings)``, ``rings: Rings =
    cache.rings()``) or a local bound to one's construction (``rings = Rings(d, k, g)``)."""
    if not (
        isinstance(expr, cst.Call)
        and method_name(expr) == "_asdict"
        and not expr.args
        and isinstance(expr.func, cst.Attribute)
        and isinstance(expr.func.value, cst.Name)
    ):
        return None
    cls = bound_class(prov, expr.func.value, site)
    return None if cls is None else _field_names(prov, cls, site)


def bound_class(prov: Provenance, name: cst.Name, site: Site) -> cst.BaseExpression | None:
    """The class ``name``'s one binding says it is an instance of: a parameter's or a local's
    annotation (``state: ReplayState``, ``Optional["Rings"]``), or the callee of a construction
    bound to it (``rings = Rings(d, k, g)``: a class only if the caller finds one there)."""
    found = prov.lookup(name.value, site)
    if not found or len(found) != 1:
        return None
    binding = found[0][0]
    if binding.kind == "param":
        param = binding.node
        if not isinstance(param, cst.Param) or param.annotation is None:
            return None
        return annotated_name(param.annotation)
    if binding.kind != "assign":
        return None
    statement = binding.statement
    for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.AnnAssign) and small.target is binding.node:
            return annotated_name(small.annotation)  # `rings: Rings = cache.rings()`
    return binding.value.func if isinstance(binding.value, cst.Call) else None


def _field_names(prov: Provenance, cls: cst.BaseExpression, site: Site) -> list[str] | None:
    """The positional fields of the project's record class ``cls`` names."""
    from replaylint.lint.dataflow.records import positional_fields  # records reads strings

    fields = positional_fields(prov, cst.Call(func=cls), site)
    return None if fields is None else [name for name, _ in fields]


def imported_record_requires(prov: Provenance, qualified: str, field: str) -> bool:
    """Whether ``qualified`` (a dotted name as the module imports it) is a record class of
    another module of the project that declares ``field`` without a default, or with a literal
    torch dtype (``gate: torch.dtype = torch.float32``): judged where it is declared."""
    project = prov.project
    if project is None:
        return False
    found = project.resolve(qualified)
    if not isinstance(found, Found) or found.definition[0] != "class":
        return False
    members, flags = found.definition[2], found.definition[3]
    member = members.get(field) if isinstance(members, dict) else None
    if not (bool(flags.get("record")) and isinstance(member, list) and len(member) > 2):
        return False
    default = member[2]
    return default == ["required"] or (
        isinstance(default, list)
        and default[:2] == ["attr", ["name", "torch"]]
        and len(default) == 3
        and dtype_from_qualified_name(f"torch.{default[2]}") is not None
    )
