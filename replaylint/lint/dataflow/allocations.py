"""Recognising tensor allocations and literal dtypes, through the module's import aliases."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import Allocation, AllocationKind
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.torch_api import (
    NEW_METHODS,
    POSITIONAL_DTYPE,
    TORCH_FACTORIES,
    TORCH_LIKE_FACTORIES,
    TORCH_RANGE_FACTORIES,
    dtype_from_qualified_name,
)
from replaylint.lint.syntax.nodes import keyword_arg, method_name, positional_args


def method_receiver(index: ModuleIndex, call: cst.Call) -> cst.BaseExpression | None:
    """``x`` in ``x.foo(...)`` when that is a method call on a value, not ``module.function()``."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    if isinstance(func.value, (cst.Name, cst.Attribute)) and index.imported_names(func.value):
        return None
    return func.value


def as_allocation(index: ModuleIndex, expr: cst.BaseExpression) -> Allocation | None:
    """Describe ``expr`` if it is a tensor allocation we know the dtype semantics of."""
    if not isinstance(expr, cst.Call):
        return None
    for name in index.qualified_names(expr.func):
        kind: AllocationKind
        ranged = name in TORCH_RANGE_FACTORIES and keyword_arg(expr, "dtype") is not None
        if name in TORCH_FACTORIES or ranged:
            kind = "factory"
        elif name in TORCH_LIKE_FACTORIES:
            kind = "like"
        else:
            continue
        dtype_arg = keyword_arg(expr, "dtype")
        if dtype_arg is None and name in POSITIONAL_DTYPE:
            positional = positional_args(expr)
            if len(positional) > POSITIONAL_DTYPE[name]:
                dtype_arg = positional[POSITIONAL_DTYPE[name]]
        return Allocation(expr, kind, name, dtype_arg)
    method = method_name(expr)
    if method in NEW_METHODS and method_receiver(index, expr) is not None:
        return Allocation(expr, "new", method, keyword_arg(expr, "dtype"))
    return None


def literal_dtype(index: ModuleIndex, expr: cst.BaseExpression) -> str | None:
    """The canonical dtype ``expr`` names (``th.half`` -> ``"float16"``), or None if not literal."""
    for name in index.qualified_names(expr):
        dtype = dtype_from_qualified_name(name)
        if dtype is not None:
            return dtype
    return None


def dtype_source(index: ModuleIndex, allocation: Allocation) -> cst.BaseExpression | None:
    """The tensor whose dtype a ``like`` or ``new_*`` allocation takes without a dtype argument:
    ``t`` of ``torch.zeros_like(t)`` or of ``t.new_zeros(...)``; None for a factory."""
    if allocation.kind == "like":
        positional = positional_args(allocation.call)
        return positional[0].value if positional else None
    if allocation.kind == "new":
        return method_receiver(index, allocation.call)
    return None
