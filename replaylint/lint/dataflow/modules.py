"""Module casts: ``Pool(...).to(torch.bfloat16)`` converts the gate buffer a module registers.

``nn.Module.to(dtype)``, ``.half()``, ``.bfloat16()`` and ``.double()`` cast every floating
parameter and buffer of the module, so a gate cache registered as a float32 buffer turns bf16
when the model is moved "to the model dtype" — the most common way a correct buffer goes wrong.
:func:`gate_buffer_classes` finds the module's classes that register a floating gate buffer
(directly or through a base class of the module), and :func:`module_cast` says whether a call
casts an instance of one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.facts import DtypeFact, Kind
from replaylint.lint.dataflow.torch_api import CAST_METHODS, FLOAT32, NON_FLOATING_DTYPES
from replaylint.lint.syntax.nodes import (
    dotted_name,
    keyword_arg,
    literal_string,
    method_name,
    positional_args,
)
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

GUARD = "keep_fp32_gate_caches"
_GUARD_MIXIN = "KeepFp32GateCaches"
# methods of nn.Module that return the module itself, keeping what it holds
_MODULE_CHAIN = frozenset({"to", "cuda", "cpu", "eval", "train", "requires_grad_", "share_memory"})


@dataclass(frozen=True)
class GateBuffer:
    """A class of the module that registers a floating gate buffer."""

    cls: cst.ClassDef
    """The class whose instances hold the buffer."""
    name: str
    """The gate cache's name."""
    node: cst.CSTNode
    """Where it is registered (the ``register_buffer`` call or the assignment)."""


@dataclass(frozen=True)
class ModuleCast:
    call: cst.Call
    buffer: GateBuffer
    dtypes: tuple[DtypeFact, ...]


# `register_buffer("<name>"` or `register_buffer(f"..."`, read from the module's text
_REGISTERED = re.compile(r"register_buffer\s*\(\s*[fFrR]?(['\"])(.*?)\1")


def gate_buffer_classes(prov: Provenance) -> dict[str, GateBuffer]:
    """Classes of the module, by name, that hold a floating gate buffer and are not guarded."""
    source = prov.index.source
    if source is not None and not any(
        prov.index.gate_caches.matches(re.sub(r"\{[^}]*\}", "0", match.group(2)))
        for match in _REGISTERED.finditer(source)
    ):
        return {}  # no gate buffer registered by name: no class to walk
    own: dict[str, GateBuffer] = {}
    classes = {cls.name.value: cls for cls in prov.index.classes()}
    for cls in classes.values():
        found = _registered(prov, cls)
        if found is not None:
            own[cls.name.value] = found
    result: dict[str, GateBuffer] = {}
    for name, cls in classes.items():
        if _guarded(cls):
            continue
        buffer = _inherited(name, classes, own, set())
        if buffer is not None:
            result[name] = replace(buffer, cls=cls)  # registered in `cls` or a base class
    return result


def module_cast(
    prov: Provenance, call: cst.Call, site: Site, classes: dict[str, GateBuffer]
) -> ModuleCast | None:
    """``call`` when it casts an instance of one of ``classes`` to a dtype not provably
    float32."""
    method = method_name(call)
    if method is None or not isinstance(call.func, cst.Attribute):
        return None
    dtypes: tuple[DtypeFact, ...]
    if method in CAST_METHODS:
        dtypes = (DtypeFact(CAST_METHODS[method], call.func.attr),)
    elif method == "to":
        dtype_arg = keyword_arg(call, "dtype")
        expr = dtype_arg.value if dtype_arg is not None else None
        for arg in positional_args(call)[:2]:
            if expr is None and to_argument_role(prov, arg.value, site) == "dtype":
                expr = arg.value
        if expr is None:
            return None
        dtypes = prov.dtype_facts(expr, site)
    else:
        return None
    if all(d.dtype == FLOAT32 or d.dtype in NON_FLOATING_DTYPES for d in dtypes):
        return None
    buffer = _instance_of(prov, call.func.value, site, classes, 0)
    return None if buffer is None else ModuleCast(call, buffer, dtypes)


def _instance_of(
    prov: Provenance,
    expr: cst.BaseExpression,
    site: Site,
    classes: dict[str, GateBuffer],
    depth: int,
) -> GateBuffer | None:
    if depth > 4:
        return None
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Name) and expr.func.value in classes:
            return classes[expr.func.value]
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _MODULE_CHAIN:
            return _instance_of(prov, expr.func.value, site, classes, depth + 1)
        return None
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site) or []
        made = [
            _instance_of(prov, b.value, s, classes, depth + 1)
            for b, s in found
            if b.kind == "assign" and b.value is not None
        ]
        if found and len(made) == len(found) and all(m is not None for m in made):
            return made[0]
    return None


def _registered(prov: Provenance, cls: cst.ClassDef) -> GateBuffer | None:
    """The first floating gate buffer ``cls``'s own methods register."""
    stack: list[cst.CSTNode] = [cls.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.ClassDef):
            continue
        if isinstance(node, cst.Call) and method_name(node) == "register_buffer":
            args = positional_args(node)
            key = literal_string(args[0].value) if args else None
            if (
                key is not None
                and prov.index.gate_caches.matches(key)
                and len(args) >= 2
                and _floating(prov, cls, args[1].value)
            ):
                return GateBuffer(cls, key, node)
        stack.extend(reversed(node.children))
    return None


def _floating(prov: Provenance, cls: cst.ClassDef, value: cst.BaseExpression) -> bool:
    """Whether the buffer may be floating point (not an index or a mask, not None)."""
    if isinstance(value, cst.Name) and value.value == "None":
        return False
    site = Site((prov.index.module, cls), None)
    facts = prov.tensor_facts(value, site)
    return not (facts and all(f.kind is Kind.NOT_FLOATING for f in facts))


def _guarded(cls: cst.ClassDef) -> bool:
    decorated = any(
        GUARD
        in (
            dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
            or ""
        )
        for d in cls.decorators
    )
    mixin = any(_GUARD_MIXIN in (dotted_name(base.value) or "") for base in cls.bases)
    return decorated or mixin or _own_apply(cls)


def _own_apply(cls: cst.ClassDef) -> bool:
    """Whether ``cls`` overrides ``nn.Module._apply`` (what ``.to``, ``.half`` ... run), so it
    decides itself what a cast does to its buffers."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(isinstance(s, cst.FunctionDef) and s.name.value == "_apply" for s in body)


def _inherited(
    name: str,
    classes: dict[str, cst.ClassDef],
    own: dict[str, GateBuffer],
    seen: set[str],
) -> GateBuffer | None:
    if name in own:
        return own[name]
    if name in seen or name not in classes:
        return None
    seen.add(name)
    for base in classes[name].bases:
        base_name = dotted_name(base.value)
        if base_name is not None and base_name in classes:
            if _guarded(classes[base_name]):
                return None
            found = _inherited(base_name, classes, own, seen)
            if found is not None:
                return found
    return None
