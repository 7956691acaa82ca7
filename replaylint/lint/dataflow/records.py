"""Records built in the module and read back: fields of NamedTuples and dataclasses, elements of
tuples, and the values a tuple unpacking binds.

``rings = Rings(d, k, g.to(torch.bfloat16))`` then ``rings.g``, ``rings[2]`` or ``*rings``;
``rings = rings._replace(g=x)`` and ``dataclasses.replace(rings, g=x)``; ``d, k, g =
load_rings(path)`` where ``load_rings`` is a function of the module that returns a tuple. The
value of a field is the argument the construction passed for it, by keyword or in field order, or
the class's default; a record whose class the module does not define, or whose fields the module
assigns anywhere (``rings.g = x``), is not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import libcst as cst

from replaylint.lint.dataflow import imported, summary_values
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.strings import Env, bound_in
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import (
    constant_slice,
    dotted_name,
    keyword_arg,
    plain_elements,
    positional_args,
    record_fields,
)
from replaylint.lint.syntax.sites import Site

_MAX_DEPTH = 8
"""Comprehensions, conversions and names followed to reach a sequence of known length."""

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

Passed = Literal["keyword", "positional", "default"]


@dataclass(frozen=True)
class FieldValue:
    """The expression a record's field holds, where it is evaluated, and how it got there."""

    value: cst.BaseExpression
    site: Site
    passed: Passed


def field_value(
    prov: Provenance, record: cst.BaseExpression, field: str | int, site: Site, env: Env
) -> FieldValue | None:
    """What field ``field`` (a name, or a position) of ``record`` holds, when the module shows it."""
    if not prov.enter():
        return None
    try:
        return _field_value(prov, record, field, site, env)
    finally:
        prov.leave()


def _field_value(
    prov: Provenance, record: cst.BaseExpression, field: str | int, site: Site, env: Env
) -> FieldValue | None:
    bound = bound_in(env, record)
    if bound is not None:
        return field_value(prov, bound.expr, field, bound.site, bound.env(env))
    if isinstance(record, (cst.Tuple, cst.List)):
        if not isinstance(field, int):
            return None
        elements = plain_elements(record)
        if elements is None or field >= len(elements):
            return None
        return FieldValue(elements[field], site, "positional")
    if isinstance(record, cst.Name):
        found = prov.lookup(record.value, site, env)
        if not found or len(found) != 1:
            return None
        binding, binding_site = found[0]
        if binding.kind != "assign" or binding.value is None:
            return None
        return field_value(prov, binding.value, field, binding_site, env)
    if isinstance(record, cst.Subscript):  # `SPECS[1].dtype`: that element's field
        index = record.slice[0].slice if len(record.slice) == 1 else None
        if not isinstance(index, cst.Index) or not isinstance(index.value, cst.Integer):
            return None
        element = field_value(prov, record.value, int(index.value.value, 0), site, env)
        if element is None:
            return None
        return field_value(prov, element.value, field, element.site, env)
    if not isinstance(record, cst.Call):
        return None
    func = record.func
    if isinstance(func, cst.Attribute) and func.attr.value == "_replace":
        return _replaced(prov, record, func.value, field, site, env)
    if "dataclasses.replace" in prov.index.qualified_names(func):
        args = positional_args(record)
        if len(args) != 1:
            return None
        return _replaced(prov, record, args[0].value, field, site, env)
    if isinstance(func, cst.Name):
        cls = _record_class(prov, func.value)
        if cls is not None:
            return _constructed(prov, cls, record, field, site)
    names = _imported_fields(prov, record, site, env)
    if names is not None:
        return _passed(prov, names, record, field, site)
    return None


def positional_fields(
    prov: Provenance, call: cst.Call, site: Site
) -> list[tuple[str, bool]] | None:
    """``(field, has a default)`` for each positional field of the record class ``call``
    constructs (defined in the module or another module of the project); None otherwise."""
    func = call.func
    cls = _record_class(prov, func.value) if isinstance(func, cst.Name) else None
    if cls is not None:
        fields = record_fields(cls)
        return None if fields is None else [(name, d is not None) for name, d in fields]
    found = _imported_class(prov, call, site, {})
    if found is None:
        return None
    members, names = found
    return [(name, members[name][2:3] != [["required"]]) for name in names]


def _imported_fields(prov: Provenance, call: cst.Call, site: Site, env: Env) -> list[str] | None:
    """The positional fields of the record class another module of the project defines and
    ``call`` constructs; None for anything else."""
    if any(arg.star for arg in call.args):
        return None
    found = _imported_class(prov, call, site, env)
    return None if found is None else found[1]


def _imported_class(
    prov: Provenance, call: cst.Call, site: Site, env: Env
) -> tuple[dict[str, Any], list[str]] | None:
    """The members and positional fields of the record class of another module ``call``
    constructs."""
    if prov.project is None:
        return None
    try:
        value = summary_values.as_value(prov, call.func, site, env)
        if value is None:
            return None
        target = imported.Evaluation(prov, call).target(
            value, imported.Context(prov.project.module)
        )
    except (imported.Unknown, *imported.MALFORMED):
        return None
    if not isinstance(target, Found) or target.definition[0] != "class":
        return None
    members, flags = target.definition[2], target.definition[3]
    fields = flags.get("fields")
    if not isinstance(fields, list) or flags.get("init"):
        return None  # an own `__init__` may fill the fields otherwise
    if any(members.get(name, ["unknown"])[0] != "field" for name in fields):
        return None
    return members, [str(name) for name in fields]


def _passed(
    prov: Provenance, names: list[str], call: cst.Call, field: str | int, site: Site
) -> FieldValue | None:
    """The argument of ``call`` that fills ``field`` of a record whose positional fields are
    ``names``; None for a field the call leaves to its default."""
    if isinstance(field, int):
        if field >= len(names):
            return None
        field = names[field]
    if field not in names or prov.index.assigns_attribute(field):
        return None  # an instance may carry another value than the one it was built with
    passed = keyword_arg(call, field)
    if passed is not None:
        return FieldValue(passed.value, site, "keyword")
    position = names.index(field)
    positional = positional_args(call)
    if position < len(positional):
        return FieldValue(positional[position].value, site, "positional")
    return None


def _replaced(
    prov: Provenance,
    call: cst.Call,
    original: cst.BaseExpression,
    field: str | int,
    site: Site,
    env: Env,
) -> FieldValue | None:
    """``original._replace(g=x)``: ``x`` for ``g``, the original's value for the others."""
    if any(arg.star for arg in call.args):
        return None
    name = field
    if isinstance(field, int):
        cls = _class_of(prov, original, site, env)
        fields = record_fields(cls) if cls is not None else None
        if fields is None or field >= len(fields):
            return None
        name = fields[field][0]
    assert isinstance(name, str)
    replacement = keyword_arg(call, name)
    if replacement is not None:
        return FieldValue(replacement.value, site, "keyword")
    return field_value(prov, original, field, site, env)


def _constructed(
    prov: Provenance, cls: cst.ClassDef, call: cst.Call, field: str | int, site: Site
) -> FieldValue | None:
    fields = record_fields(cls)
    if fields is None or any(arg.star for arg in call.args):
        return None
    names = [name for name, _ in fields]
    passed = _passed(prov, names, call, field, site)
    name = names[field] if isinstance(field, int) and field < len(names) else field
    if passed is not None or name not in names or prov.index.assigns_attribute(str(name)):
        return passed
    default = fields[names.index(str(name))][1]
    if default is None:
        return None
    return FieldValue(default, Site((prov.index.module, cls), None), "default")


def elements(
    prov: Provenance, sequence: cst.BaseExpression, site: Site, env: Env
) -> list[FieldValue] | None:
    """Every element ``*sequence`` passes, in order, when their number is known (a literal tuple
    or list, a record built in the module, a slice with literal bounds of one: ``*bufs[1:4]``);
    None otherwise."""
    cut = constant_slice(sequence)
    if cut is not None:
        assert isinstance(sequence, cst.Subscript)
        whole = elements(prov, sequence.value, site, env)
        return None if whole is None else whole[cut]
    length = sequence_length(prov, sequence, site, env)
    if length is None:
        return None
    found: list[FieldValue] = []
    for position in range(length):
        value = field_value(prov, sequence, position, site, env)
        if value is None:
            return None
        found.append(value)
    return found


def sequence_length(
    prov: Provenance, sequence: cst.BaseExpression, site: Site, env: Env, depth: int = 0
) -> int | None:
    """How many values ``*sequence`` passes, when the module fixes it: a literal tuple or list, a
    comprehension over one (``[make(s) for s in sizes]``), ``tuple(...)``/``list(...)`` of one,
    a NamedTuple built in the module."""
    if depth > _MAX_DEPTH:
        return None
    cut = constant_slice(sequence)
    if cut is not None:
        assert isinstance(sequence, cst.Subscript)
        whole = sequence_length(prov, sequence.value, site, env, depth + 1)
        return None if whole is None else len(range(whole)[cut])
    if isinstance(sequence, cst.Name):
        found = prov.lookup(sequence.value, site, env)
        if found and len(found) == 1:
            value = found[0][0].value
            if isinstance(value, (cst.Tuple, cst.List, cst.ListComp, cst.GeneratorExp)) or (
                value is not None and _sequence_call(value) is not None
            ):
                sequence, site = value, found[0][1]
    if isinstance(sequence, (cst.Tuple, cst.List)):
        plain = plain_elements(sequence)
        return None if plain is None else len(plain)
    if isinstance(sequence, (cst.ListComp, cst.GeneratorExp)):
        loop = sequence.for_in
        if loop.ifs or loop.inner_for_in is not None or loop.asynchronous is not None:
            return None
        return sequence_length(prov, loop.iter, site, env, depth + 1)
    converted = _sequence_call(sequence)
    if converted is not None:
        return sequence_length(prov, converted, site, env, depth + 1)
    cls = _class_of(prov, sequence, site, env)
    if cls is None or not any(
        (dotted_name(base.value) or "").endswith("NamedTuple") for base in cls.bases
    ):
        return None  # only a NamedTuple unpacks into its fields
    fields = record_fields(cls)
    return None if fields is None else len(fields)


def _sequence_call(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """``tuple(x)`` / ``list(x)``: ``x``."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value in {"tuple", "list"}
        and len(expr.args) == 1
        and expr.args[0].keyword is None
        and not expr.args[0].star
    ):
        return expr.args[0].value
    return None


def _class_of(
    prov: Provenance, record: cst.BaseExpression, site: Site, env: Env
) -> cst.ClassDef | None:
    """The record class ``record`` is an instance of, when the module shows its construction."""
    for _ in range(8):
        if isinstance(record, cst.Name):
            found = prov.lookup(record.value, site, env)
            if not found or len(found) != 1 or found[0][0].value is None:
                return None
            record, site = found[0][0].value, found[0][1]
            continue
        if not isinstance(record, cst.Call):
            return None
        func = record.func
        if isinstance(func, cst.Attribute) and func.attr.value == "_replace":
            record = func.value
            continue
        if isinstance(func, cst.Name):
            return _record_class(prov, func.value)
        return None
    return None


def _record_class(prov: Provenance, name: str) -> cst.ClassDef | None:
    matching = [cls for cls in prov.index.classes() if cls.name.value == name]
    if len(matching) != 1 or record_fields(matching[0]) is None:
        return None
    return matching[0]


def unpacked(binding: Binding) -> tuple[cst.BaseExpression, int] | None:
    """``d, k, g = <value>``: the value and the position ``binding``'s name takes in it."""
    statement = binding.statement
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    for small in statement.body:
        if not isinstance(small, cst.Assign):
            continue
        for target in small.targets:
            names = target.target
            if not isinstance(names, (cst.Tuple, cst.List)):
                continue
            if any(isinstance(e, cst.StarredElement) for e in names.elements):
                return None
            for position, element in enumerate(names.elements):
                if element.value is binding.node:
                    return small.value, position
    return None
