"""What ``dtype`` a ``**kwargs`` mapping passes to an allocation (or any other keyword, such as
the ``g_cache`` a mapping passes to a decode entry point).

``torch.zeros(shape, **factory_kwargs)`` gets its dtype from the mapping, and real code builds that
mapping in many ways: a dict literal (``{"device": d, "dtype": t}``), ``dict(...)``, spreads where a
later key wins (``{**kw, "dtype": torch.float32}``, ``dict(kw, dtype=...)``), and mutations after
the literal (``kw["dtype"] = t``, ``kw.update(dtype=t)``, ``kw.setdefault("dtype", t)``). The
answer is one of: the mapping certainly has no ``dtype`` (:data:`ABSENT`), the expressions its
``dtype`` may be (every one of them present for sure), or that it cannot be read (:data:`UNKNOWN`:
the mapping is a parameter, escapes into a call, may lose its ``dtype``, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import libcst as cst

from replaylint.lint.dataflow.scopes import dominates
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.syntax.nodes import keyword_arg, literal_string, positional_args
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

ABSENT: Literal["absent"] = "absent"
UNKNOWN: Literal["unknown"] = "unknown"


@dataclass(frozen=True)
class DtypeEntries:
    """The mapping surely has a ``dtype`` entry: one of ``values`` (each read at its site)."""

    values: tuple[tuple[cst.BaseExpression, Site], ...]


KwargsDtype = DtypeEntries | Literal["absent", "unknown"]

_READ_METHODS = frozenset({"get", "keys", "values", "items", "copy", "__contains__"})


def kwargs_dtype(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env, key: str = "dtype"
) -> KwargsDtype:
    """The ``key`` entry (``dtype`` unless told) that ``**expr`` passes (see the module
    docstring)."""
    if not prov.enter():
        return UNKNOWN
    try:
        return _kwargs_dtype(prov, expr, site, env, key)
    finally:
        prov.leave()


def spreads_dtype(
    prov: Provenance,
    spreads: Sequence[cst.BaseExpression],
    site: Site,
    env: Env,
    key: str = "dtype",
) -> KwargsDtype:
    """The ``key`` entry that ``f(**a, **b)`` passes: the last spread that surely sets one wins."""
    state: KwargsDtype = ABSENT
    for spread in spreads:
        state = _merge(state, kwargs_dtype(prov, spread, site, env, key))
    return state


def _kwargs_dtype(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env, key: str
) -> KwargsDtype:
    if isinstance(expr, cst.Dict):
        return _dict_literal(prov, expr, site, env, key)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "dict":
        return _dict_call(prov, expr, site, env, key)
    if not isinstance(expr, cst.Name):
        return UNKNOWN
    found = prov.lookup(expr.value, site, env)
    if not found or len(found) != 1:
        return UNKNOWN
    binding, binding_site = found[0]
    if binding.kind != "assign" or binding.value is None or binding.scope is None:
        return UNKNOWN
    state = _kwargs_dtype(prov, binding.value, binding_site, env, key)
    scope = prov.index.scope(binding.scope)
    use = scope.statements.get(id(site.statement)) if site.statement is not None else None
    for value, statement in _mutations(binding.scope, expr.value, binding.node, key):
        if value is None:
            return UNKNOWN
        # read where it is written: a name in the value may be rebound between
        written_at = Site(binding_site.scopes, statement) if statement is not None else binding_site
        written = DtypeEntries(((value, written_at),))
        where = scope.statements.get(id(statement)) if statement is not None else None
        if where is None or use is None:
            state = _either(state, written)
        elif where[0] > use[0]:
            continue  # written after the allocation ran
        elif dominates(where[1], use[1]):
            state = written  # every path to the allocation writes it: the later key wins
        else:
            state = _either(state, written)
    return state


def _merge(earlier: KwargsDtype, later: KwargsDtype) -> KwargsDtype:
    """A mapping built from ``earlier`` and then ``later``: a later ``dtype`` key wins."""
    if isinstance(later, DtypeEntries):
        return later
    return UNKNOWN if later is UNKNOWN else earlier


def _either(first: KwargsDtype, second: DtypeEntries) -> KwargsDtype:
    """One of two mappings, when it is not known which (a conditional write)."""
    if not isinstance(first, DtypeEntries):
        return UNKNOWN  # may have no dtype at all, or one not followed
    return DtypeEntries((*first.values, *second.values))


def _dict_literal(
    prov: Provenance, mapping: cst.Dict, site: Site, env: Env, key: str
) -> KwargsDtype:
    state: KwargsDtype = ABSENT
    for element in mapping.elements:
        if not isinstance(element, cst.DictElement):
            state = _merge(state, kwargs_dtype(prov, element.value, site, env, key))
            continue
        written = literal_string(element.key)
        if written is None:
            state = UNKNOWN  # a computed key may be `key`
        elif written == key:
            state = DtypeEntries(((element.value, site),))
    return state


def _dict_call(prov: Provenance, call: cst.Call, site: Site, env: Env, key: str) -> KwargsDtype:
    state: KwargsDtype = ABSENT
    positional = positional_args(call)
    if len(positional) > 1:
        return UNKNOWN
    if positional:
        state = kwargs_dtype(prov, positional[0].value, site, env, key)
    for arg in call.args:
        if arg.star == "**":
            state = _merge(state, kwargs_dtype(prov, arg.value, site, env, key))
        elif arg.star == "*":
            return UNKNOWN
    entry = keyword_arg(call, key)
    if entry is not None:
        state = DtypeEntries(((entry.value, site),))
    return state


def table_call(
    prov: Provenance, name: cst.Name, key: str, site: Site, env: Env
) -> tuple[cst.Call, Site] | None:
    """The call the mapping ``name`` is bound to, once (``dtypes = ring_dtypes(dtype)``), when
    its scope writes the ``key`` entry nowhere after that and changes the mapping in no way not
    followed (passed on, ``pop``, ``del``): what ``dtypes[key]`` reads is what the call returns."""
    found = prov.lookup(name.value, site, env)
    if not found or len(found) != 1:
        return None
    binding, binding_site = found[0]
    if binding.kind != "assign" or not isinstance(binding.value, cst.Call):
        return None
    if next(_mutations(binding_site.scope, name.value, binding.node, key), None) is not None:
        return None
    return binding.value, binding_site


def mapping_writes(
    scope: cst.CSTNode, name: str, binding_target: cst.CSTNode, key: str
) -> Iterator[Mutation]:
    """Each write of the ``key`` entry of the mapping ``name`` bound at ``binding_target`` in
    ``scope`` (a value of None: a change not followed, a ``pop`` or an ``update``); passing the
    mapping on or returning it is no write here."""
    return _mutations(scope, name, binding_target, key, passed_on=False)


Mutation = tuple[cst.BaseExpression | None, cst.CSTNode | None]
"""A ``dtype`` written into a mapping (None: a change not followed) and the statement doing it."""


def _mutations(
    scope: cst.CSTNode, name: str, binding_target: cst.CSTNode, key: str, *, passed_on: bool = True
) -> Iterator[Mutation]:
    """Each ``key`` entry written into the mapping ``name`` in ``scope``, with its statement; a
    value of None for a use that may change it in ways not followed (passed on, ``pop``,
    ``del``)."""
    for use, parents in _uses(scope, name):
        statement = next((p for p in reversed(parents) if isinstance(p, _STATEMENTS)), None)
        for value in _written(use, parents, binding_target, key, passed_on):
            yield value, statement


_STATEMENTS = (cst.SimpleStatementLine, cst.SimpleStatementSuite)


def _written(
    use: cst.Name,
    parents: tuple[cst.CSTNode, ...],
    binding_target: cst.CSTNode,
    key: str,
    passed_on: bool = True,
) -> Iterator[cst.BaseExpression | None]:
    """The ``key`` values one use of the mapping writes (none for a read; None for a change
    not followed)."""
    if use is binding_target:
        return
    parent = parents[-1] if parents else None
    grand = parents[-2] if len(parents) > 1 else None
    if isinstance(parent, cst.Arg) and parent.star == "**":
        return  # read by the allocation (or another call)
    if isinstance(parent, cst.ComparisonTarget):
        return  # "dtype" in kw
    if isinstance(parent, cst.Subscript) and parent.value is use:
        written = _subscript_string(parent)
        if isinstance(grand, cst.AssignTarget):
            assign = parents[-3] if len(parents) > 2 else None
            if written is None:
                yield None
            elif written == key:
                yield assign.value if isinstance(assign, cst.Assign) else None
        elif isinstance(grand, (cst.Del, cst.AugAssign)) and written in {None, key}:
            yield None
        return  # otherwise a read: kw["device"]
    if isinstance(parent, cst.Attribute) and parent.value is use:
        if not (isinstance(grand, cst.Call) and grand.func is parent):
            return  # kw.get, not called: a read
        method = parent.attr.value
        if method in _READ_METHODS:
            return
        if method == "update":
            yield from _update_entries(grand, key)
            return
        if method == "setdefault":
            args = positional_args(grand)
            written = literal_string(args[0].value) if args else None
            if written == key and len(args) == 2:
                yield args[1].value
            elif written is None or written == key:
                yield None
            return
        yield None  # pop, popitem, clear, or a method we do not know
        return
    if passed_on:
        yield None  # passed on, returned, aliased: may be changed out of sight


def _update_entries(call: cst.Call, key: str) -> Iterator[cst.BaseExpression | None]:
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == key:
                yield arg.value
        elif arg.star == "" and isinstance(arg.value, cst.Dict):
            for element in arg.value.elements:
                if not isinstance(element, cst.DictElement):
                    yield None
                    continue
                written = literal_string(element.key)
                if written is None:
                    yield None
                elif written == key:
                    yield element.value
        else:
            yield None


def _subscript_string(subscript: cst.Subscript) -> str | None:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    return literal_string(subscript.slice[0].slice.value)


def _uses(
    node: cst.CSTNode, name: str, parents: tuple[cst.CSTNode, ...] = ()
) -> Iterator[tuple[cst.Name, tuple[cst.CSTNode, ...]]]:
    """Every ``Name(name)`` under ``node`` that is a variable (not an attribute or keyword name),
    with the chain of its parents."""
    if isinstance(node, cst.Name):
        if node.value == name:
            yield node, parents
        return
    if isinstance(node, cst.Attribute):
        yield from _uses(node.value, name, (*parents, node))
        return
    if isinstance(node, cst.Arg):
        yield from _uses(node.value, name, (*parents, node))
        return
    for child in syntax_children(node):
        yield from _uses(child, name, (*parents, node))
