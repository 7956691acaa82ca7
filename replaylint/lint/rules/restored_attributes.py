"""Every entry of a loaded mapping restored as an attribute: ``for name, t in snapshot.items():
setattr(cache, name, t)``.

The loop names no ring, so no single statement binds the gate cache; but when the object holds
one (the function, its class, the object's class or, for an object spelled the same way, the rest
of the module names ``cache.la_cache``), that attribute
comes back as the entry saved under its name, in the dtype it was saved with. Which names the
mapping holds is not known, so the gate-cache names are the object's own attributes that name
one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.dataflow.held_gate_attributes import (
    gate_attributes_spelled,
    held_gate_attributes,
)
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.syntax.nodes import method_name, positional_args
from replaylint.lint.syntax.sites import Site

__all__ = ["Restore", "restored_by_setattr"]


@dataclass(frozen=True)
class Restore:
    """One ``setattr(obj, key, value)`` of a loop over a loaded mapping's items."""

    owner: str
    """The object as written (``cache``, ``self``, ``self.pool``)."""
    key: str
    """The loop's name variable."""
    value: cst.BaseExpression
    """The entry as passed: the loop's variable, or its move to a device."""
    gate_caches: tuple[str, ...]
    """The object's attributes that name a gate cache, sorted."""
    load: TensorFact
    """How the mapping's entries were loaded."""


def restored_by_setattr(
    prov: Provenance,
    names: GateCacheNames,
    loop: cst.For,
    site: Site,
    read_elsewhere: Callable[[cst.Name | cst.Attribute], set[str]] | None = None,
) -> list[Restore]:
    """The ``setattr`` calls of ``loop``'s body that restore a loaded entry, uncast, on an object
    that holds a gate cache; ``read_elsewhere``: the gate caches the module reads on an object
    spelled like the one given."""
    target, iterable = loop.target, loop.iter
    if not (
        isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and all(isinstance(e.value, cst.Name) for e in target.elements)
        and isinstance(iterable, cst.Call)
        and method_name(iterable) == "items"
        and not iterable.args
        and isinstance(iterable.func, cst.Attribute)
        and isinstance(loop.body, cst.IndentedBlock)
    ):
        return []
    key, value = (e.value for e in target.elements)
    assert isinstance(key, cst.Name)
    assert isinstance(value, cst.Name)
    found: list[Restore] = []
    for line in loop.body.body:
        if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            continue
        expression = line.body[0]
        call = expression.value if isinstance(expression, cst.Expr) else None
        arguments = positional_args(call) if isinstance(call, cst.Call) else []
        if not (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value == "setattr"
            and len(arguments) == len(call.args) == 3
            and isinstance(owner := arguments[0].value, (cst.Name, cst.Attribute))
            and _is(arguments[1].value, key.value)
            and _is(_unmoved(prov, arguments[2].value, site), value.value)
        ):
            continue
        spelled = prov.index.module.code_for_node(owner)
        gate_caches: tuple[str, ...] = ()
        if isinstance(owner, cst.Name):
            gate_caches = _gate_attributes(prov, owner.value, names, site)
        if read_elsewhere is not None:
            gate_caches = tuple(sorted({*gate_caches, *read_elsewhere(owner)}))
        # `self.pool` of `self.pool = RingPool(...)`: the attributes its class keeps
        gate_caches = tuple(sorted({*gate_caches, *held_gate_attributes(prov, names, owner, site)}))
        if not gate_caches:
            continue
        loads = [f for f in prov.tensor_facts(iterable.func.value, site) if f.kind is Kind.LOADED]
        if not loads:
            continue
        found.append(Restore(spelled, key.value, arguments[2].value, gate_caches, loads[0]))
    return found


def _unmoved(prov: Provenance, expr: cst.BaseExpression, site: Site) -> cst.BaseExpression:
    """``t`` of ``t.to(device)``, ``t.to(pool.device)``, ``t.cpu()``: a move keeps the dtype."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return expr
    method, args = expr.func.attr.value, expr.args
    if method in {"cpu", "cuda"} and not any(
        a.keyword and a.keyword.value == "dtype" for a in args
    ):
        return expr.func.value
    if method == "to" and len(args) == 1:
        moved = args[0]
        if (moved.keyword is not None and moved.keyword.value == "device") or (
            moved.keyword is None and to_argument_role(prov, moved.value, site) == "device"
        ):
            return expr.func.value
    return expr


def _is(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _gate_attributes(
    prov: Provenance, owner: str, names: GateCacheNames, site: Site
) -> tuple[str, ...]:
    """The attributes ``owner.X`` that name a gate cache, read or written in the function; for
    ``self``, in its class; for a local made by a class of the module (``cache =
    ReplayCache(...)``), in that class."""
    attributes = gate_attributes_spelled(site.scope, owner, names)
    if owner == "self" and (cls := site.enclosing_class()) is not None:
        attributes |= gate_attributes_spelled(cls, "self", names)
    for binding, _ in prov.lookup(owner, site) or ():
        value = binding.value if binding.kind == "assign" else None
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
            for cls in prov.index.classes():
                if cls.name.value == value.func.value:
                    attributes |= gate_attributes_spelled(cls, "self", names)
    return tuple(sorted(attributes))
