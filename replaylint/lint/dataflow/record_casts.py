"""Casts of a ring record by its own method: ``state.to(device, dtype=self.dtype)`` on an
instance of a project record class whose ``to`` casts every floating tensor it holds
(:mod:`replaylint.lint.project.field_casters`).

The receiver's class is known from a parameter's or a local's annotation (``state:
ReplayState``) or from a construction bound to it (:func:`.record_names.bound_class`); the dtype is the argument the call passes for the method's dtype
parameter. A float32 (or integer) dtype converts nothing; which of the record's fields are gate
rings is the caller's question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.record_names import bound_class
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import is_none_literal, keyword_arg, positional_args
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["RecordCast", "record_cast"]

_NOT_FLOATING = frozenset({"int8", "int16", "int32", "int64", "uint8", "bool"})


@dataclass(frozen=True)
class RecordCast:
    """A call that casts every floating tensor of a record of another module."""

    record: str
    """The record class's name."""
    where: str
    """``path:line`` of the cast in the record's method."""
    fields: tuple[str, ...]
    """The record's fields."""
    dtype: cst.BaseExpression
    """The argument the call passes for the method's dtype parameter."""
    facts: tuple[DtypeFact, ...]


def record_cast(prov: Provenance, call: cst.Call, site: Site) -> RecordCast | None:
    """The cast ``call`` makes of a record's every floating tensor; None for anything else."""
    view = prov.project
    func = call.func
    if view is None or not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
        return None
    if not any(_dtype_like(arg) for arg in call.args):
        return None  # no dtype passed: nothing is cast (asked first, before any lookup)
    named = bound_class(prov, func.value, site)
    qualified = sorted(prov.index.qualified_names(named)) if named is not None else []
    if len(qualified) != 1:
        return None
    found = view.resolve(qualified[0])
    if not isinstance(found, Found) or found.definition[0] != "class":
        return None
    members, flags = found.definition[2], found.definition[3]
    caster = (flags.get("field_casters") or {}).get(func.attr.value)
    if not isinstance(caster, list) or not isinstance(members, dict):
        return None
    position, parameter, line = caster
    arg = keyword_arg(call, str(parameter))
    positional = positional_args(call)
    if (
        arg is None
        and 0 <= position < len(positional)
        and not any(a.star for a in call.args[: position + 1])
    ):
        arg = positional[position]
    if arg is None or is_none_literal(arg.value):
        return None
    facts = tuple(prov.dtype_facts(arg.value, site))
    if facts and all(f.is_float32 or f.dtype in _NOT_FLOATING for f in facts):
        return None
    fields = tuple(
        name
        for name, member in members.items()
        if isinstance(member, list) and member and member[0] == "field"
    )
    where = f"{view.index.path_of(found.module)}:{line}"
    return RecordCast(found.name, where, fields, arg.value, facts)


def _dtype_like(arg: cst.Arg) -> bool:
    """``dtype=...``, ``torch.bfloat16``, ``self.param_dtype``: an argument that may be a dtype."""
    if arg.keyword is not None:
        return "dtype" in arg.keyword.value
    value = arg.value
    name = value.attr.value if isinstance(value, cst.Attribute) else None
    if isinstance(value, cst.Name):
        name = value.value
    return name is not None and ("dtype" in name.lower() or name in _TORCH_DTYPES)


_TORCH_DTYPES = frozenset({"float16", "half", "bfloat16", "float32", "float", "float64"})
