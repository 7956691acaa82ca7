"""Entries of literal containers: ``{"g_cache": torch.float32}[name]`` and ``DTYPES[i]``.

A dict or a tuple written in the module (directly, or through a local or module constant bound
once) is read like a table: with the key or index known (a literal, or a loop variable in the
iteration being evaluated), the entry is the expression the analysis follows. So is the dict a
function of the module returns (``dtypes = ring_dtypes(dtype); dtypes["g_cache"]``), entry by
entry of each ``return``, when the caller never writes that entry afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import strings
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.kwargs import table_call
from replaylint.lint.dataflow.strings import Env, bound_in
from replaylint.lint.syntax.nodes import literal_string, plain_element
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def dict_literal(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env
) -> tuple[cst.Dict | None, Site]:
    """A dict literal, directly, through a local or module constant bound once, or as the entry
    of one (``TABLE["bf16"]`` of ``TABLE = {"bf16": {...}, ...}``)."""
    if isinstance(expr, cst.Dict):
        return expr, site
    bound = bound_in(env, expr)
    if bound is not None:  # `spec` in `for name, spec in SPECS.items()`
        return dict_literal(prov, bound.expr, bound.site, bound.env(env))
    if not prov.enter():
        return None, site
    try:
        if isinstance(expr, cst.Name):
            found = prov.lookup(expr.value, site, env)
            if found and len(found) == 1:
                value, at = found[0][0].value, found[0][1]
                if isinstance(value, cst.Dict):
                    return value, at
                if isinstance(value, cst.Subscript):  # `server = TABLE["bf16"]`
                    return dict_literal(prov, value, at, env)
        if isinstance(expr, cst.Subscript):
            outer, outer_site = dict_literal(prov, expr.value, site, env)
            entry = None if outer is None else dict_entry(prov, outer, expr, site, env)
            if entry is not None:
                return dict_literal(prov, entry, outer_site, env)
        return None, site
    finally:
        prov.leave()


def returned_entries(
    prov: Provenance, subscript: cst.Subscript, site: Site, env: Env
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """``dtypes[key]`` of ``dtypes = helper(...)``, a function of the module every ``return`` of
    which is a dict literal holding ``key``: the entry of each; None otherwise."""
    table = subscript.value
    if not isinstance(table, cst.Name) or len(subscript.slice) != 1:
        return None
    index = subscript.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    key = strings.string_value(prov, index.value, site, env)
    if key is None:
        return None
    bound = table_call(prov, table, key, site, env)
    if bound is None:
        return None
    shared = _shared_entry(prov, bound[0], key, bound[1])
    if shared is not None:  # `dtypes = dict.fromkeys(NAMES, dtype)`
        return [(shared, bound[1])]
    called = called_function(prov.index, prov, bound[0], bound[1])
    if called is None:
        return None
    function, scopes, _ = called
    entries: list[tuple[cst.BaseExpression, Site]] = []
    for returned, statement in prov.index.scope(function).returns:
        mapping, where = (
            dict_literal(prov, returned.value, Site(scopes, statement), {})
            if returned.value is not None
            else (None, site)
        )
        entry = None if mapping is None else _entry(prov, mapping, key, where)
        if entry is None:
            return None
        entries.append((entry, where))
    return entries or None


def dict_entry(
    prov: Provenance, mapping: cst.Dict, subscript: cst.Subscript, site: Site, env: Env
) -> cst.BaseExpression | None:
    """``{"g_cache": torch.float32, ...}[name]`` with ``name`` known from ``env``."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    key = strings.string_value(prov, subscript.slice[0].slice.value, site, env)
    return None if key is None else _entry(prov, mapping, key, site)


def _entry(prov: Provenance, mapping: cst.Dict, key: str, site: Site) -> cst.BaseExpression | None:
    """The value ``mapping[key]`` holds: the last entry that sets it, a ``**dict.fromkeys(...)``
    of keys holding ``key`` included; None when it is not known (a ``**`` of anything else may
    set it)."""
    for element in reversed(mapping.elements):
        if isinstance(element, cst.DictElement):
            if literal_string(element.key) == key:
                return element.value
            continue
        keys = fromkeys_parts(element.value)
        names = None if keys is None else listed_names(prov, keys[0], site)
        if keys is None or names is None:
            return None  # `**other`: it may set `key`
        if key in names:
            return keys[1]
    return None


def _shared_entry(
    prov: Provenance, call: cst.Call, key: str, site: Site
) -> cst.BaseExpression | None:
    """``v`` of ``dict.fromkeys(keys, v)`` when ``key`` is one of ``keys`` (a literal collection,
    a constant, a class constant of the project)."""
    keys = fromkeys_parts(call)
    if keys is None or key not in (listed_names(prov, keys[0], site) or ()):
        return None
    return keys[1]


def fromkeys_parts(
    expr: cst.BaseExpression,
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """``(keys, v)`` of ``dict.fromkeys(keys, v)``."""
    if not (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "fromkeys"
        and isinstance(expr.func.value, cst.Name)
        and expr.func.value.value == "dict"
        and len(expr.args) == 2
        and not any(arg.star or arg.keyword for arg in expr.args)
    ):
        return None
    return expr.args[0].value, expr.args[1].value


def listed_names(prov: Provenance, keys: cst.BaseExpression, site: Site) -> list[str] | None:
    """The strings the collection ``keys`` lists, in order (a literal, a constant, a class
    constant of the project); None when it is no such collection."""
    envs = strings.iterations(prov, _KEY, keys, site)
    if envs is None:
        return None
    return [name for env in envs if isinstance(name := env.get(_KEY.value), str)]


_KEY = cst.Name("key")


def sequence_entry(
    prov: Provenance, subscript: cst.Subscript, site: Site, env: Env
) -> tuple[cst.BaseExpression, Site] | None:
    """``DTYPES[i]`` for a literal tuple or list and an index known in this iteration."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice.value
    bound = bound_in(env, index)
    if bound is not None:
        index = bound.expr
    if not isinstance(index, cst.Integer):
        return None
    sequence, where = subscript.value, site
    bound = bound_in(env, sequence)
    if bound is not None:
        sequence, where = bound.expr, bound.site
    elif isinstance(sequence, cst.Name):
        found = prov.lookup(sequence.value, site, env)
        if not found or len(found) != 1 or found[0][0].value is None:
            return None
        sequence, where = found[0][0].value, found[0][1]
    if not isinstance(sequence, (cst.Tuple, cst.List)):
        return None
    element = plain_element(sequence, int(index.value, 0))
    return None if element is None else (element, where)
