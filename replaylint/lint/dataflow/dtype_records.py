"""Records of the rings' dtypes, and the argument a construction passes for the gate ring's.

``CacheRecipe(state=torch.float32, delta=torch.bfloat16, key=torch.bfloat16, gate=torch.float32)``
is a table of dtypes with fields for keys: a NamedTuple or dataclass of the module whose fields
name the rings. Its gate field is the gate ring's dtype when it is named for it (``gate_dtype``,
``g_cache_dtype``), or when it is declared ``torch.dtype`` under the gate's word (``gate``, ``g``,
``log_decay``) or a gate-cache name beside fields for the d and the k ring (``delta``/``d``,
``key``/``k``, as in :mod:`replaylint.lint.gatecache.siblings`): a router's ``gate`` beside
``experts`` is no ring's. A construction fills it by keyword, in field order, or through a spread
literal (``CacheRecipe(*(torch.bfloat16,) * 4)``, ``*(a, b, c, d)``). Only classes of the module
are read: the module's text then declares the field, which the pre-filter looks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import libcst as cst

from replaylint.lint.gatecache.names import GATE_FIELD_WORDS
from replaylint.lint.gatecache.siblings import D_WORDS, K_WORDS
from replaylint.lint.syntax.nodes import dotted_name, keyword_arg, record_fields

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["GateField", "gate_field_arguments", "spread_elements"]

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
    """The arguments ``call`` passes for the gate-dtype fields of the record class it constructs,
    a class of the module (whose text then names the field, as the pre-filter requires); empty
    for anything else."""
    if not isinstance(call.func, cst.Name):
        return []
    cls = _record_class(prov, call)
    fields = record_fields(cls) if cls is not None else None
    if cls is None or not fields:
        return []
    names = [name for name, _ in fields]
    declared = _dtype_fields(cls)
    gates = [name for name in names if _gate_dtype_field(prov, name, names, declared)]
    found: list[GateField] = []
    for name in gates:
        passed = keyword_arg(call, name)
        if passed is not None:
            found.append(GateField(name, passed.value, "keyword", passed))
    positional = [arg for arg in call.args if arg.keyword is None and arg.star != "**"]
    place = 0
    for arg in positional:
        if arg.star == "*":
            elements = spread_elements(arg.value)
            if elements is None:
                break  # the places after an unknown spread are not known
            for offset, element in enumerate(elements):
                if place + offset < len(names) and names[place + offset] in gates:
                    found.append(GateField(names[place + offset], element, "spread", arg, offset))
            place += len(elements)
            continue
        if place < len(names) and names[place] in gates:
            found.append(GateField(names[place], arg.value, "positional", arg))
        place += 1
    return found


def _record_class(prov: Provenance, call: cst.Call) -> cst.ClassDef | None:
    if not isinstance(call.func, cst.Name):
        return None
    named = prov.index.declared_classes().get(call.func.value, [])
    return named[0] if len(named) == 1 else None


def _dtype_fields(cls: cst.ClassDef) -> set[str]:
    """The fields ``cls`` declares as ``name: torch.dtype``."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return {
        small.target.value
        for statement in body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.AnnAssign)
        and isinstance(small.target, cst.Name)
        and dotted_name(small.annotation.annotation) == "torch.dtype"
    }


def _gate_dtype_field(prov: Provenance, name: str, names: list[str], declared: set[str]) -> bool:
    gate_caches = prov.index.gate_caches
    if gate_caches.names_gate_dtype(name):
        return True
    if name not in declared or (
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
