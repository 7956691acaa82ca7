"""Records of the rings' dtypes, and the argument a construction passes for the gate ring's.

``CacheRecipe(state=torch.float32, delta=torch.bfloat16, key=torch.bfloat16, gate=torch.float32)``
is a table of dtypes with fields for keys: a NamedTuple or dataclass of the module whose fields
name the rings. Its gate field is the gate ring's dtype when it is named for it (``gate_dtype``,
``g_cache_dtype``), or when it is declared ``torch.dtype`` under the gate's word (``gate``, ``g``,
``log_decay``) or a gate-cache name beside fields for the d and the k ring (``delta``/``d``,
``key``/``k``, as in :mod:`replaylint.lint.gatecache.siblings`): a router's ``gate`` beside
``experts`` is no ring's. A construction fills it by keyword, in field order, or through a spread
literal (``CacheRecipe(*(torch.bfloat16,) * 4)``, ``*(a, b, c, d)``). The class is one of the
module, or a record class imported from another module of the project, read from its summary:
there the annotations are not kept, so a field named for a gate ring counts whatever it is
declared as (a construction that gives it a dtype literal says what it holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import libcst as cst

from replaylint.lint.gatecache.names import GATE_FIELD_WORDS
from replaylint.lint.gatecache.siblings import D_WORDS, K_WORDS
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import dotted_name, is_none_literal, keyword_arg, record_fields

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["GateField", "gate_field_arguments", "record_dtype_fields", "spread_elements"]

_MAX_SPREAD = 64  # a repeated tuple longer than this is no record of ring dtypes


@dataclass(frozen=True)
class GateField:
    """The argument a record construction passes for the gate ring's dtype."""

    field: str
    value: cst.BaseExpression
    """The expression that fills the field (an element of a spread literal, for a spread)."""
    passed: Literal["keyword", "positional", "spread"]
    arg: cst.Arg
    spread_place: int = 0
    """For a spread: the field's place among the elements the spread gives."""


def gate_field_arguments(prov: Provenance, call: cst.Call) -> list[GateField]:
    """The arguments ``call`` passes for the gate-dtype fields of the record class it constructs:
    a class of the module (whose text then names the field, as the pre-filter requires) or one
    imported from another module of the project; empty for anything else."""
    shape = _record_shape(prov, call)
    if shape is None:
        return []
    names, positional, declared = shape
    gates = [name for name in names if _gate_dtype_field(prov, name, names, declared)]
    found: list[GateField] = []
    for name in gates:
        passed = keyword_arg(call, name)
        if passed is not None:
            found.append(GateField(name, passed.value, "keyword", passed))
    place = 0
    for arg in (a for a in call.args if a.keyword is None and a.star != "**"):
        if positional is None:
            break  # which argument fills which field is not certain
        if arg.star == "*":
            elements = spread_elements(arg.value)
            if elements is None:
                break  # the places after an unknown spread are not known
            for offset, element in enumerate(elements):
                at = place + offset
                if at < len(positional) and positional[at] in gates:
                    found.append(GateField(positional[at], element, "spread", arg, offset))
            place += len(elements)
            continue
        if place < len(positional) and positional[place] in gates:
            found.append(GateField(positional[place], arg.value, "positional", arg))
        place += 1
    return found


_RecordShape = tuple[list[str], "list[str] | None", "set[str] | None"]
"""A record class's field names, those its constructor fills by position (None: not certain),
and those declared ``torch.dtype`` (None: every field may be, as the annotations are not read)."""


def _record_shape(prov: Provenance, call: cst.Call) -> _RecordShape | None:
    cls = _record_class(prov, call)
    if cls is not None:
        fields = record_fields(cls)
        if not fields:
            return None
        names = [name for name, _ in fields]
        return names, names, _dtype_fields(cls)
    found = _project_record(prov, call)
    if found is None:
        return None
    members, flags = found.definition[2], found.definition[3]
    names = [name for name, member in members.items() if member[0] == "field"]
    positional = flags.get("fields")
    if not names or not flags.get("record") or (flags.get("bases") and not _named_tuple(flags)):
        return None
    return names, positional if isinstance(positional, list) else None, None


def _named_tuple(flags: dict[str, Any]) -> bool:
    """Whether a class's only base is ``NamedTuple``: its fields are its own."""
    facts = flags.get("module")
    bases = facts.get("bases") if isinstance(facts, dict) else None
    return (
        isinstance(bases, list)
        and len(bases) == 1
        and isinstance(bases[0], list)
        and str(bases[0][-1]).endswith("NamedTuple")
    )


def _project_record(prov: Provenance, call: cst.Call) -> Found | None:
    """The record class of another module of the project that ``call`` constructs."""
    if prov.project is None or not isinstance(call.func, (cst.Name, cst.Attribute)):
        return None
    names = prov.index.imported_names(call.func)
    if len(names) != 1:
        return None
    dotted = next(iter(names))
    known = prov.project.index.record_names
    if known is not None and dotted.rpartition(".")[2] not in known:
        return None  # no file of the project that mentions a record defines it
    target = prov.project.resolve(dotted)
    return target if isinstance(target, Found) and target.definition[0] == "class" else None


def _record_class(prov: Provenance, call: cst.Call) -> cst.ClassDef | None:
    if not isinstance(call.func, cst.Name):
        return None
    named = prov.index.declared_classes().get(call.func.value, [])
    return named[0] if len(named) == 1 else None


def _dtype_fields(cls: cst.ClassDef) -> set[str]:
    """The fields ``cls`` declares as ``name: torch.dtype`` (optional included)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return {
        small.target.value
        for statement in body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.AnnAssign)
        and isinstance(small.target, cst.Name)
        and _torch_dtype(small.annotation.annotation)
    }


def _torch_dtype(annotation: cst.BaseExpression) -> bool:
    """``torch.dtype``, ``torch.dtype | None`` or ``Optional[torch.dtype]``."""
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        parts = [annotation.left, annotation.right]
        return any(_torch_dtype(p) for p in parts) and all(
            _torch_dtype(p) or is_none_literal(p) for p in parts
        )
    if isinstance(annotation, cst.Subscript) and dotted_name(annotation.value) in _OPTIONAL:
        inner = annotation.slice[0].slice if len(annotation.slice) == 1 else None
        return isinstance(inner, cst.Index) and _torch_dtype(inner.value)
    return dotted_name(annotation) == "torch.dtype"


_OPTIONAL = frozenset({"Optional", "typing.Optional"})


def record_dtype_fields(prov: Provenance, cls: cst.ClassDef) -> tuple[str, set[str]] | None:
    """The gate-dtype field of the record class ``cls`` of this module, and every field it
    declares a dtype; None when it has no such field."""
    fields = record_fields(cls)
    if not fields:
        return None
    declared = _dtype_fields(cls)
    if len(declared) < 2:
        return None  # a record of one dtype sets no ring's apart from another's
    gate_caches = prov.index.gate_caches
    gates = [
        name
        for name, _ in fields
        if name in declared
        and (
            name.lower() in GATE_FIELD_WORDS
            or gate_caches.names_gate_dtype(name)
            or gate_caches.matches(name)
        )
    ]
    return (gates[0], declared) if len(gates) == 1 else None


def _gate_dtype_field(
    prov: Provenance, name: str, names: list[str], declared: set[str] | None
) -> bool:
    gate_caches = prov.index.gate_caches
    if gate_caches.names_gate_dtype(name):
        return True
    if (declared is not None and name not in declared) or (
        name.lower() not in GATE_FIELD_WORDS and not gate_caches.matches(name)
    ):
        return False
    words = [set(other.lower().split("_")) for other in names if other != name]
    return any(w & set(D_WORDS) for w in words) and any(w & set(K_WORDS) for w in words)


def spread_elements(value: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    """The elements ``*value`` gives: a tuple or list literal, or one repeated by a number."""
    if isinstance(value, (cst.Tuple, cst.List)):
        if any(isinstance(e, cst.StarredElement) for e in value.elements):
            return None
        return [e.value for e in value.elements]
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        sequence, count = value.left, value.right
        if isinstance(sequence, cst.Integer):
            sequence, count = count, sequence
        if not isinstance(count, cst.Integer):
            return None
        elements = spread_elements(sequence)
        times = int(count.value, 0)
        if elements is None or len(elements) * times > _MAX_SPREAD:
            return None
        return elements * times
    return None
