"""Tensor methods: what ``x.half()``, ``x.to(...)``, ``x.clone()``, ``state.get(key)`` ... make of
their receiver.

A method call that is not an allocation, an operator or a helper of the module lands here: casts
(``CAST_METHODS``, ``.to``, ``.view``, ``.type``, ``.type_as``), copies that keep what they copy
(``.clone()``, the dtype-preserving methods), and reads of a loaded mapping (``.get``, ``.pop``,
safetensors' ``get_tensor``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import casts, dict_entries, loads, strings
from replaylint.lint.dataflow.facts import (
    CastMethodToFloat,
    CastValue,
    DtypeFact,
    Kind,
    TensorFact,
    TypeAsDeviceOfOther,
)
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.dataflow.torch_api import (
    CAST_METHODS,
    DTYPE_PRESERVING_METHODS,
    FLOAT32,
    NON_FLOATING_DTYPES,
)
from replaylint.lint.syntax.nodes import method_name, one_line, positional_args
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def method_facts(
    prov: Provenance, call: cst.Call, receiver: cst.BaseExpression | None, site: Site, env: Env
) -> Iterator[TensorFact]:
    """The facts of ``receiver.method(...)``; UNKNOWN for a method the analysis does not know."""
    method = method_name(call)
    if method is None or receiver is None:
        yield TensorFact(Kind.UNKNOWN, call)
        return
    if method in CAST_METHODS:
        dtype = CAST_METHODS[method]
        assert isinstance(call.func, cst.Attribute)
        if dtype == FLOAT32:
            yield TensorFact(Kind.FLOAT32, call, detail="`.float()`")
        elif dtype in NON_FLOATING_DTYPES:
            yield TensorFact(Kind.NOT_FLOATING, call, dtypes=(DtypeFact(dtype, call),))
        else:
            yield TensorFact(
                Kind.CAST,
                call.func.attr,
                call=call,
                dtypes=(DtypeFact(dtype, call.func.attr),),
                detail=f"`.{method}()`",
                target=CastMethodToFloat(
                    call.func.attr, call if not call.args and casts.held(receiver) else None
                ),
            )
        return
    if method == "to":
        yield from casts.to_facts(prov, call, receiver, site, env)
        return
    if method == "view":
        yield from casts.view_facts(prov, call, receiver, site, env)
        return
    if method == "type":
        yield from casts.type_facts(prov, call, site, env)
        return
    if method == "type_as":
        args = positional_args(call)
        if args and prov.all_float32(prov.tensor_facts(args[0].value, site, env)):
            yield TensorFact(Kind.FLOAT32, call)
        else:
            yield TensorFact(
                Kind.CAST,
                call,
                call=call,
                detail="`.type_as(...)`",
                target=TypeAsDeviceOfOther(call) if len(args) == 1 else None,
            )
        return
    if method == "clone":
        for fact in prov.tensor_facts(receiver, site, env):
            if fact.kind is Kind.UNKNOWN:
                yield TensorFact(
                    Kind.INHERITED,
                    call,
                    call=call,
                    detail=f"a clone of `{one_line(prov.index.module, receiver)}`",
                    target=CastValue(call),
                )
            else:
                yield fact
        return
    if method == "get_tensor":
        yield TensorFact(
            Kind.LOADED,
            call,
            call=call,
            detail="`get_tensor(...)` (safetensors)",
            target=CastValue(call),
        )
        return
    if method in {"get", "pop"} and positional_args(call):  # a mapping's entry
        if loads.is_loaded(prov, receiver, site, env):
            detail = loads.describe_load(prov.index, receiver)
            yield TensorFact(Kind.LOADED, call, call=call, detail=detail, target=CastValue(call))
            return
        key = strings.string_value(prov, positional_args(call)[0].value, site, env)
        if key is not None and prov.index.gate_caches.matches(key):
            yield TensorFact(Kind.FLOAT32, call, detail="a gate cache")
            return
        entry = None if key is None else dict_entries.entry_facts(prov, receiver, key, site, env)
        yield from entry if entry is not None else (TensorFact(Kind.UNKNOWN, call),)
        return
    if method in DTYPE_PRESERVING_METHODS:
        yield from prov.tensor_facts(receiver, site, env)
        return
    yield TensorFact(Kind.UNKNOWN, call)
