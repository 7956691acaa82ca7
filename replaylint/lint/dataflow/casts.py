"""Casts: what ``x.to(...)`` and ``x.type(...)`` make of a tensor's dtype.

``.to`` takes a dtype, a device, another tensor or a mix, positionally or by keyword; which one an
argument is (:func:`to_argument_role`) is read from literals, names, annotations and local
bindings. ``.type`` also takes legacy tensor type names (``torch.cuda.HalfTensor``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.allocations import as_allocation, literal_dtype
from replaylint.lint.dataflow.facts import (
    DeviceOfOther,
    DtypeFact,
    Float32Target,
    FloatTensorType,
    Kind,
    OverrideKwargsDtype,
    SetDtype,
    TensorFact,
    all_not_floating,
    definite_dtype,
)
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.kwargs import UNKNOWN, DtypeEntries, spreads_dtype
from replaylint.lint.dataflow.strings import NO_ENV, Env
from replaylint.lint.dataflow.torch_api import (
    DEVICE_ANNOTATIONS,
    DTYPE_ANNOTATIONS,
    FLOAT32_TENSOR_TYPE,
    TENSOR_ANNOTATIONS,
    TENSOR_TYPE_DTYPES,
)
from replaylint.lint.syntax.nodes import (
    binding_name,
    keyword_arg,
    literal_string,
    one_line,
    positional_args,
)
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


_RING_NAME = re.compile(r"(?:^|_)(?:ring|cache|buffer|buf)s?$", re.IGNORECASE)
# names of a tensor passed for its dtype and device: `ref`, `other`, `weight_ref`, `like`
_REFERENCE_NAME = re.compile(r"(?:^|_)(?:ref|reference|other|like|template)$", re.IGNORECASE)


def to_facts(
    prov: Provenance, call: cst.Call, receiver: cst.BaseExpression, site: Site, env: Env
) -> Iterator[TensorFact]:
    dtype_arg = keyword_arg(call, "dtype")
    positional = positional_args(call)
    dtype_expr: cst.BaseExpression | None = dtype_arg.value if dtype_arg is not None else None
    other: cst.BaseExpression | None = None
    if dtype_expr is None and positional:
        first = positional[0].value
        role = to_argument_role(prov, first, site, env)
        if role == "dtype":
            dtype_expr = first
        elif role == "tensor":
            other = first
        elif role == "device" and len(positional) > 1:
            second = positional[1].value
            # `.to(device, dtype)`: the one place after a device is the dtype's
            if to_argument_role(prov, second, site, env) in {"dtype", "unknown"}:
                dtype_expr = second
        elif role == "unknown":
            yield TensorFact(Kind.UNKNOWN, call)
            return
    spreads = [arg.value for arg in call.args if arg.star == "**"]
    if dtype_expr is None and spreads:
        passed = spreads_dtype(prov, spreads, site, env)
        if passed is UNKNOWN:
            yield TensorFact(Kind.UNKNOWN, call)
            return
        if isinstance(passed, DtypeEntries):
            yield from _spread_cast(prov, call, spreads, passed, env)
            return
    if dtype_expr is not None:
        detail = f"`.to({one_line(prov.index.module, dtype_expr)})`"
        facts = prov.dtype_facts(dtype_expr, site, env)
        # a dtype that is surely not float32 made a copy of a float32 source; a variable one
        # may be float32 at run time, where the cast handed the source back as it is
        narrowing = bool(facts) and all(f.dtype is not None and not f.is_float32 for f in facts)
        copying = (
            call if narrowing and keyword_arg(call, "copy") is None and held(receiver) else None
        )
        yield _cast(call, dtype_expr, facts, detail, SetDtype(dtype_expr, copying))
        return
    if other is not None:
        other_facts = prov.tensor_facts(other, site, env)
        if prov.all_float32(other_facts):
            yield TensorFact(Kind.FLOAT32, call)
            return
        if other_facts and all(f.kind is Kind.NOT_FLOATING for f in other_facts):
            yield TensorFact(Kind.NOT_FLOATING, call)
            return
        literal = [definite_dtype(f) for f in other_facts]
        dtypes = tuple(DtypeFact(d, other) for d in literal)
        yield TensorFact(
            Kind.CAST,
            other,
            call=call,
            dtypes=dtypes,
            detail=f"`.to({one_line(prov.index.module, other)})`, which takes that tensor's dtype",
            target=DeviceOfOther(positional[0]),
        )
        return
    # Only a device (or nothing that changes the dtype): the receiver's dtype.
    yield from prov.tensor_facts(receiver, site, env)


def _spread_cast(
    prov: Provenance,
    call: cst.Call,
    spreads: list[cst.BaseExpression],
    passed: DtypeEntries,
    env: Env,
) -> Iterator[TensorFact]:
    """``x.to(**kw)`` where ``kw`` surely carries a ``dtype``."""
    facts = tuple(f for expr, where in passed.values for f in prov.dtype_facts(expr, where, env))
    if all(f.is_float32 for f in facts):
        yield TensorFact(Kind.FLOAT32, call, dtypes=facts)
    elif all_not_floating(facts):
        yield TensorFact(Kind.NOT_FLOATING, call, dtypes=facts)
    else:
        mapping = spreads[-1]
        yield TensorFact(
            Kind.CAST,
            mapping,
            call=call,
            dtypes=facts,
            detail=f"`.to(**{one_line(prov.index.module, mapping)})`",
            # `{**kw, "dtype": torch.float32}` keeps every other entry; with two spreads the
            # other one may carry a dtype too
            target=OverrideKwargsDtype(mapping) if len(spreads) == 1 else None,
        )


def view_facts(
    prov: Provenance, call: cst.Call, receiver: cst.BaseExpression, site: Site, env: Env
) -> Iterator[TensorFact]:
    """``x.view(shape)`` keeps the dtype; ``x.view(dtype)`` reinterprets the bits as ``dtype``.

    A reinterpretation has no fix: the view aliases ``x``'s storage, and reading float32 out of
    a bf16 buffer would give other values, not the same ones in another precision.
    """
    args = positional_args(call)
    dtype_arg = keyword_arg(call, "dtype")
    dtype_expr = dtype_arg.value if dtype_arg is not None else None
    if (
        dtype_expr is None
        and len(args) == 1
        and len(call.args) == 1
        and to_argument_role(prov, args[0].value, site, env) == "dtype"
    ):
        dtype_expr = args[0].value  # a literal dtype, or a name that holds one (`dtype`)
    if dtype_expr is None:
        yield from prov.tensor_facts(receiver, site, env)
        return
    facts = prov.dtype_facts(dtype_expr, site, env)
    if all(f.is_float32 for f in facts):
        yield TensorFact(Kind.FLOAT32, call, dtypes=facts)
    elif all_not_floating(facts):
        yield TensorFact(Kind.NOT_FLOATING, call, dtypes=facts)
    else:
        text = one_line(prov.index.module, dtype_expr)
        yield TensorFact(
            Kind.CAST,
            dtype_expr,
            call=call,
            dtypes=facts,
            detail=f"`.view({text})`, which reinterprets the buffer's bits as {text}",
        )


def type_facts(prov: Provenance, call: cst.Call, site: Site, env: Env) -> Iterator[TensorFact]:
    args = positional_args(call)
    dtype_arg = keyword_arg(call, "dtype")
    target = dtype_arg.value if dtype_arg is not None else (args[0].value if args else None)
    if target is None:
        yield TensorFact(Kind.UNKNOWN, call)  # x.type() returns a string
        return
    if isinstance(target, cst.Attribute) and target.attr.value.endswith("Tensor"):
        # x.type(torch.cuda.HalfTensor): a tensor type object, not a dtype
        tensor_type = target.attr.value
        if tensor_type == FLOAT32_TENSOR_TYPE:
            yield TensorFact(Kind.FLOAT32, call)
            return
        dtypes = (DtypeFact(TENSOR_TYPE_DTYPES.get(tensor_type), target),)
        detail = f"`.type({one_line(prov.index.module, target)})`"
        yield _cast(
            call, target.attr, dtypes, detail, FloatTensorType(target.attr, FLOAT32_TENSOR_TYPE)
        )
        return
    name = literal_string(target)
    if name is not None:
        if name.endswith(("FloatTensor", "float32")):
            yield TensorFact(Kind.FLOAT32, call)
            return
        replacement = _float_tensor_type(name)
        dtypes = (DtypeFact(TENSOR_TYPE_DTYPES.get(name.rpartition(".")[2]), target),)
        float_type = None if replacement is None else FloatTensorType(target, replacement)
        yield _cast(call, target, dtypes, f"`.type({name!r})`", float_type)
        return
    facts = prov.dtype_facts(target, site, env)
    detail = f"`.type({one_line(prov.index.module, target)})`"
    yield _cast(call, target, facts, detail, SetDtype(target))


def _cast(
    call: cst.Call,
    node: cst.CSTNode,
    dtypes: tuple[DtypeFact, ...],
    detail: str,
    target: Float32Target | None,
) -> TensorFact:
    """What a cast to one of ``dtypes`` makes: float32, a tensor that is not floating point at
    all (an index or a mask), or a cast that a finding points at ``node`` for."""
    if dtypes and all(d.is_float32 for d in dtypes):
        return TensorFact(Kind.FLOAT32, call, dtypes=dtypes)
    if all_not_floating(dtypes):
        return TensorFact(Kind.NOT_FLOATING, call, dtypes=dtypes)
    return TensorFact(Kind.CAST, node, call=call, dtypes=dtypes, detail=detail, target=target)


def held(receiver: cst.BaseExpression) -> bool:
    """Whether ``receiver`` names a tensor others may hold (a name, an attribute, an item,
    ``getattr(obj, name)``): a cast of it that would hand it back as it is must copy instead. A
    fresh value (an allocation, arithmetic) has no other holder."""
    if isinstance(receiver, (cst.Name, cst.Attribute, cst.Subscript)):
        return True
    return (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Name)
        and receiver.func.value == "getattr"
    )


def to_argument_role(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV
) -> str:
    """What the first argument of ``x.to(arg)`` is: dtype, device, tensor or unknown."""
    if literal_dtype(prov.index, expr) is not None:
        return "dtype"
    if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.Integer)):
        return "device"
    if isinstance(expr, cst.Call):
        names = prov.index.qualified_names(expr.func)
        if "torch.device" in names:
            return "device"
        if _first_parameter(expr):
            return "tensor"
        if as_allocation(prov.index, expr) is not None:
            return "tensor"
        # a helper named for what it returns: `str_dtype_to_torch(cfg.dtype)`, `get_device()`
        callee = (binding_name(expr.func) or "").lower()
        if "dtype" in callee or "data_type" in callee:
            return "dtype"
        if "device" in callee:
            return "device"
        return "unknown"
    if isinstance(expr, cst.Subscript) and _dtype_table_entry(prov, expr, site, env):
        return "dtype"
    name = binding_name(expr)
    if name is not None:
        lowered = name.lower()
        if "dtype" in lowered or "data_type" in lowered:  # `kv_data_type`, FlashInfer's spelling
            return "dtype"
        if "device" in lowered or lowered in {"dev", "cuda", "cpu", "place"}:
            return "device"
        if prov.index.gate_caches.matches(name) or _RING_NAME.search(name):
            return "tensor"  # a ring (`d_cache`, `self.k_ring`): no dtype or device is named so
        if _REFERENCE_NAME.search(name):
            return "tensor"  # `x.to(ref)`, `x.to(other)`: a tensor whose dtype and device it takes
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site, env) or []
        for binding, binding_site in found:
            if binding.kind == "param":
                return _annotation_role(prov.index, binding.node)
            if binding.kind == "assign" and binding.value is not None and prov.enter():
                try:
                    role = to_argument_role(prov, binding.value, binding_site, env)
                finally:
                    prov.leave()
                if role != "unknown":
                    return role
        return "unknown"
    return "unknown"


def _first_parameter(call: cst.Call) -> bool:
    """``next(model.parameters())``, ``next(iter(model.parameters()))``: a tensor of a model."""
    if not (isinstance(call.func, cst.Name) and call.func.value == "next" and len(call.args) == 1):
        return False
    inner = call.args[0].value
    if (
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Name)
        and inner.func.value == "iter"
        and len(inner.args) == 1
    ):
        inner = inner.args[0].value
    return (
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
        and inner.func.attr.value in {"parameters", "buffers"}
    )


def _dtype_table_entry(prov: Provenance, expr: cst.Subscript, site: Site, env: Env) -> bool:
    """``TORCH_DTYPE_MAP[cfg.dtype]``: an entry of a table named for dtypes, or of one whose
    entries the analysis reads as dtypes."""
    table = binding_name(expr.value) if isinstance(expr.value, (cst.Name, cst.Attribute)) else None
    if table is not None and "dtype" in table.lower():
        return True
    facts = prov.dtype_facts(expr, site, env)
    return bool(facts) and all(fact.dtype is not None for fact in facts)


def _annotation_role(index: ModuleIndex, node: cst.CSTNode) -> str:
    if not isinstance(node, cst.Param) or node.annotation is None:
        return "unknown"
    annotation = node.annotation.annotation
    spellings = {index.module.code_for_node(annotation).strip()}
    if isinstance(annotation, cst.BinaryOperation):  # torch.device | str
        spellings = {
            index.module.code_for_node(part).strip() for part in (annotation.left, annotation.right)
        }
    if spellings <= DEVICE_ANNOTATIONS:
        return "device"
    if spellings & DTYPE_ANNOTATIONS:
        return "dtype"
    if spellings & TENSOR_ANNOTATIONS:
        return "tensor"
    return "unknown"


def _float_tensor_type(name: str) -> str | None:
    """``"torch.cuda.HalfTensor"`` -> ``"torch.cuda.FloatTensor"``."""
    head, dot, tail = name.rpartition(".")
    if tail.endswith("Tensor") and head.startswith("torch"):
        return f"{head}{dot}FloatTensor"
    return None
