"""Names unpacked from a tuple: ``ring_dtype, gate_dtype = RING_DTYPES[mode]``.

The element a name takes is followed through the module: a tuple or list literal, a local bound
to one, and an entry of a dict literal (``TABLE["bfloat16"]``). A key the analysis cannot read
(``TABLE[mode]`` of a parameter) may be any of the table's keys, so the name may hold the
element of each entry: the table decides, and one narrower entry makes the name not provably
float32. Tables and calls of other modules of the project are read through the project index
(:func:`replaylint.lint.dataflow.imported.element_dtype_facts`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import callers, imported, records
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.syntax.nodes import plain_elements, self_attribute
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance
    from replaylint.lint.dataflow.scopes import Binding
    from replaylint.lint.dataflow.strings import Env

_MAX_DEPTH = 6
Element = tuple[cst.BaseExpression, Site, "int | None"]
"""An element's expression and site, or (with a position) a value of another module of the
project (``REPLAY_DTYPES[dtype]``) whose element at that position the project index reads."""


def unpacked_dtypes(
    prov: Provenance, binding: Binding, site: Site, env: Env
) -> tuple[DtypeFact, ...] | None:
    """The dtypes of the element a name unpacked from a tuple takes; None when that is not
    read (the name was not unpacked, or its element cannot be followed)."""
    unpacked = records.unpacked(binding) if binding.kind == "assign" else None
    if unpacked is None:
        return None
    value, position = unpacked
    elements = unpacked_elements(prov, value, position, site, env)
    return None if elements is None else element_dtypes(prov, elements, env)


def element_dtypes(prov: Provenance, elements: list[Element], env: Env) -> tuple[DtypeFact, ...]:
    """The dtypes of ``elements``: of each expression, or of the element of another module's
    value that the project index reads (an unknown fact where it does not say)."""
    facts: list[DtypeFact] = []
    for expr, where, pending in elements:
        if pending is None:
            facts.extend(prov.dtype_facts(expr, where, env))
            continue
        found = imported.element_dtype_facts(prov, expr, pending, where, env)
        facts.extend(found or (DtypeFact(None, expr),))
    return tuple(facts)


def unpacked_elements(
    prov: Provenance, value: cst.BaseExpression, position: int, site: Site, env: Env
) -> list[Element] | None:
    """Element ``position`` of ``value`` for each way ``value`` may be made; None when one of
    them cannot be read."""
    return _elements(prov, value, position, site, env, 0)


def _elements(
    prov: Provenance,
    value: cst.BaseExpression,
    position: int,
    site: Site,
    env: Env,
    depth: int,
) -> list[Element] | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, (cst.Tuple, cst.List)):
        elements = plain_elements(value)
        if elements is None or position >= len(elements):
            return None
        return [(elements[position], site, None)]
    if isinstance(value, cst.Name):
        return _bound_elements(prov, value, position, site, env, depth)
    if self_attribute(value) and (owner := site.enclosing_class()) is not None:
        assert isinstance(value, cst.Attribute)  # `self.replay_dtypes`, every value it is given
        values = list(instance_values(prov, owner, value.attr.value))
        return _all_of(prov, values, position, env, depth) if values else None
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        index = value.slice[0].slice
        table = _dict_literal(prov, value.value, site, env)
        if table is None and _imported_value(prov, value, site, env):
            return [(value, site, position)]
        if table is None or not isinstance(index, cst.Index):
            return None
        mapping, table_site = table
        key = prov.string_value(index.value, site, env)
        entries = [
            e.value
            for e in mapping.elements
            if isinstance(e, cst.DictElement)
            and (key is None or prov.string_value(e.key, table_site) == key)
        ]
        if not entries or (key is None and len(entries) != len(mapping.elements)):
            return None  # no such entry, or a `**spread` that may hold any key
        chosen = entries[-1:] if key is not None else entries
        return _all_of(prov, [(e, table_site) for e in chosen], position, env, depth)
    if isinstance(value, cst.Call) and _imported_value(prov, value, site, env):
        return [(value, site, position)]
    if isinstance(value, cst.Call):
        from replaylint.lint.dataflow.callables import returned_values

        returned = returned_values(prov, value, site, env)  # `d, k, g = ring_dtypes("no", dt)`
        if returned:
            return _all_of(prov, returned, position, NO_ENV, depth)
    return None


def _bound_elements(
    prov: Provenance, name: cst.Name, position: int, site: Site, env: Env, depth: int
) -> list[Element] | None:
    """The element of each value ``name`` may hold: what its assignments give it, and for a
    parameter, what each call of the module passes."""
    found = prov.lookup(name.value, site, env)
    if not found:
        return None
    values: list[tuple[cst.BaseExpression, Site]] = []
    for binding, binding_site in found:
        if binding.kind == "assign" and binding.value is not None and binding.value is not name:
            values.append((binding.value, binding_site))
        elif binding.kind == "param":
            passed = callers.passed_values(prov, binding)
            if not passed:
                return None  # not called here, or a call that cannot be read
            values.extend(passed)
        else:
            return None
    return _all_of(prov, values, position, env, depth)


def _all_of(
    prov: Provenance,
    values: list[tuple[cst.BaseExpression, Site]],
    position: int,
    env: Env,
    depth: int,
) -> list[Element] | None:
    gathered: list[Element] = []
    for value, where in values:
        inner = _elements(prov, value, position, where, env, depth + 1)
        if inner is None:
            return None
        gathered.extend(inner)
    return gathered


def _imported_value(prov: Provenance, value: cst.BaseExpression, site: Site, env: Env) -> bool:
    """Whether ``value`` is a table entry or call of another module of the project."""
    return prov.project is not None and as_value(prov, value, site, env) is not None


def _dict_literal(
    prov: Provenance, table: cst.BaseExpression, site: Site, env: Env
) -> tuple[cst.Dict, Site] | None:
    """The dict literal a name is bound to, once, and where."""
    if isinstance(table, cst.Dict):
        return table, site
    if not isinstance(table, cst.Name):
        return None
    found = prov.lookup(table.value, site, env)
    if not found or len(found) != 1:
        return None
    binding, binding_site = found[0]
    if binding.kind != "assign" or not isinstance(binding.value, cst.Dict):
        return None
    if _may_change(prov.index.source, binding.name):
        return None  # `TABLE[key] = ...` elsewhere: the literal is not all it holds
    return binding.value, binding_site


def _may_change(source: str | None, name: str) -> bool:
    """Whether the text may write an entry of the dict ``name`` (an item assignment or a
    method that changes it): a superset read from the text."""
    if source is None:
        return True
    written = re.compile(
        rf"\b{re.escape(name)}\s*(?:\[[^\]\n]*\]\s*(?:=(?!=)|[-+*/|]=)"
        rf"|\.\s*(?:update|setdefault|pop|popitem|clear)\s*\()"
    )
    return written.search(source) is not None
