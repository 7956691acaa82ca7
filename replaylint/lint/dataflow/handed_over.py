"""Payloads a function builds only to hand to a method that copies them into tensors of its own:
``host = RingSnapshot(..., g_cache=torch.full(shape, -0.125, dtype=torch.float64))`` followed by
``pool.restore_slots(host)``, where ``restore_slots`` writes every entry into its rings
(``target[:, index] = snapshot.g_cache.to(target.dtype)``, ``ring.copy_(entry)``). What the
payload holds is a transfer format: the receiving rings keep their own dtype, so an entry that is
not float32 is no gate cache gone wrong.

Only what is certain counts: the payload is a local bound once to a dict literal or a call, and
the function uses it for nothing but passing it, whole, to methods of the module's classes; every
method of that name takes the parameter it lands in only as the source of a copy into a tensor
(an element or slice assignment, ``copy_``), through a loop over its items or values, or reads a
field of it that names no gate cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.scopes import all_params
from replaylint.lint.syntax.nodes import method_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["handed_over"]

_ENTRY_METHODS = frozenset({"items", "values"})


def handed_over(prov: Provenance, value: cst.BaseExpression, site: Site) -> bool:
    """Whether ``value``, an entry of the payload the statement at ``site`` builds, is only
    copied into other tensors by the methods the function hands the payload to."""
    local = _payload(value, site)
    scope = site.scope
    if local is None or not isinstance(scope, cst.FunctionDef):
        return False
    mentions = sum(
        1 for n in descendants(scope.body) if isinstance(n, cst.Name) and n.value == local
    )
    passed: list[tuple[str, int | str]] = []
    for node in descendants(scope.body):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            for position, arg in enumerate(node.args):
                if isinstance(arg.value, cst.Name) and arg.value.value == local and not arg.star:
                    place: int | str = arg.keyword.value if arg.keyword else position
                    passed.append((node.func.attr.value, place))
    if not passed or mentions != len(passed) + 1:  # the binding, and each hand-over
        return False
    return all(_copies_only(prov, method, place) for method, place in passed)


def _payload(value: cst.BaseExpression, site: Site) -> str | None:
    """``host`` of ``host = Record(..., g_cache=value)`` or ``host = {"g": value, ...}``."""
    statement = site.statement
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return None
    target, built = small.targets[0].target, small.value
    if not isinstance(target, cst.Name):
        return None
    if isinstance(built, cst.Dict):
        entries = [e.value for e in built.elements if isinstance(e, cst.DictElement)]
    elif isinstance(built, cst.Call):
        entries = [arg.value for arg in built.args]
    else:
        return None
    return target.value if any(entry is value for entry in entries) else None


def _copies_only(prov: Provenance, method: str, place: int | str) -> bool:
    """Whether every method ``method`` of the module's classes only copies from the parameter
    that ``place`` (a position after ``self``, or a keyword) fills."""
    found = [
        statement
        for cls in prov.index.classes()
        if isinstance(cls.body, cst.IndentedBlock)
        for statement in cls.body.body
        if isinstance(statement, cst.FunctionDef) and statement.name.value == method
    ]
    if not found:
        return False
    for function in found:
        params = [p for p in all_params(function.params) if p.star == ""][1:]
        names = [p.name.value for p in params]
        if isinstance(place, int):
            if place >= len(names):
                return False
            param = names[place]
        elif place in names:
            param = place
        else:
            return False
        if not _only_copied_from(prov, function, param):
            return False
    return True


def _only_copied_from(prov: Provenance, function: cst.FunctionDef, param: str) -> bool:
    sources = {param}  # the parameter, and the loop variables that take its entries
    for loop in descendants(function.body):
        if isinstance(loop, cst.For) and _iterates_entries(loop.iter, param):
            entry = _entry_target(loop)
            if entry is None:
                return False
            sources.add(entry)
    for node in descendants(function.body):
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if not _copy_or_field_read(prov, small, sources):
                    return False
        elif (
            isinstance(node, (cst.If, cst.While))
            and not _field_reads_only(prov, node.test, sources)
        ) or (
            isinstance(node, cst.For)
            and not (
                _iterates_entries(node.iter, param) or _field_reads_only(prov, node.iter, sources)
            )
        ):
            return False
    return True


def _iterates_entries(iterable: cst.BaseExpression, param: str) -> bool:
    """``param.items()``, ``param.values()`` or ``param`` itself."""
    if isinstance(iterable, cst.Name):
        return iterable.value == param
    return (
        isinstance(iterable, cst.Call)
        and method_name(iterable) in _ENTRY_METHODS
        and not iterable.args
        and isinstance(iterable.func, cst.Attribute)
        and isinstance(iterable.func.value, cst.Name)
        and iterable.func.value.value == param
    )


def _entry_target(loop: cst.For) -> str | None:
    """The loop variable that takes each entry (the second of ``for name, t in p.items()``)."""
    target = loop.target
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        entry = target.elements[1].value
        return entry.value if isinstance(entry, cst.Name) else None
    return None


def _copy_or_field_read(prov: Provenance, small: cst.BaseSmallStatement, sources: set[str]) -> bool:
    """Whether the statement copies from ``sources`` into a tensor (an element or slice
    assignment, ``copy_``) or reads fields of them that name no gate cache."""
    if isinstance(small, cst.Assign) and all(_into_tensor(t.target) for t in small.targets):
        return True  # `ring[:, index] = entry.to(ring.dtype)`: the ring keeps its dtype
    if (
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.Call)
        and method_name(small.value) == "copy_"
        and isinstance(small.value.func, cst.Attribute)
        and not _mentions(small.value.func.value, sources)
    ):
        return True
    return _field_reads_only(prov, small, sources)


def _into_tensor(target: cst.BaseAssignTargetExpression) -> bool:
    """``ring[:, index]``, ``ring[..., :n]``: a slice of a tensor, written in place (an element of
    a list or dict, ``rings[name]``, is replaced instead)."""
    if not isinstance(target, cst.Subscript):
        return False
    elements = target.slice
    return len(elements) > 1 or any(
        isinstance(e.slice, cst.Slice)
        or (isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis))
        for e in elements
    )


def _field_reads_only(prov: Provenance, node: cst.CSTNode, sources: set[str]) -> bool:
    """Whether every mention of ``sources`` in ``node`` reads a field that names no gate cache
    (``snapshot.slots``, ``snapshot["write_pos"]``)."""
    names = prov.index.gate_caches
    mentions = sum(1 for n in descendants(node) if isinstance(n, cst.Name) and n.value in sources)
    fields = 0
    for n in descendants(node):
        holder = n.value if isinstance(n, (cst.Attribute, cst.Subscript)) else None
        if not (isinstance(holder, cst.Name) and holder.value in sources):
            continue
        field: object = None
        if isinstance(n, cst.Attribute):
            field = n.attr.value
        elif isinstance(n, cst.Subscript) and len(n.slice) == 1:
            index = n.slice[0].slice
            key = index.value if isinstance(index, cst.Index) else None
            field = key.evaluated_value if isinstance(key, cst.SimpleString) else None
        if isinstance(field, str) and not names.matches(field):
            fields += 1
    return mentions == fields


def _mentions(node: cst.CSTNode, sources: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in sources for n in descendants(node))
