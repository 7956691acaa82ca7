"""A module instance built right here, and the methods the scope calls on it.

A cast converts the buffers the instance holds when it is cast. Right after construction that
is what the constructor registered: buffers a later method makes (``setup_cache``) are not
there yet, and a cast of ``Transformer(args)`` leaves them to be allocated in their own dtype
(:mod:`replaylint.lint.project.buffer_makers` tells which method makes each buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.instances import MODULE_CHAIN, chain_root
from replaylint.lint.syntax.nodes import is_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

# methods that move or cast what a module holds but make no buffer
_KEEPING = MODULE_CHAIN | {"half", "bfloat16", "float", "double", "type", "eval", "train"}

IsClass = Callable[[cst.BaseExpression, Site], bool]
"""Whether a called expression names a module class (here or in the project)."""


def methods_called(receiver: cst.BaseExpression, site: Site) -> frozenset[str]:
    """The methods the scope calls on the name ``receiver`` is (``model.setup_caches(...)``)
    before the statement at ``site``: what runs after a cast does not change what it casts."""
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value  # `model.cuda().half()`
    if not isinstance(receiver, cst.Name):
        return frozenset()
    called: set[str] = set()
    for node in descendants(site.scope):  # in source order
        if node is site.statement:
            break
        method = _method_called_on(node, receiver.value)
        if method is not None:
            called.add(method)
    return frozenset(called)


def method_flags(receiver: cst.BaseExpression, site: Site) -> dict[str, dict[str, object]]:
    """Per method the scope calls on the name ``receiver`` is before the statement at ``site``,
    the literal keyword arguments of the call (``model.attach_rings(n, graph=True)``); a
    method called twice with different values has none for that keyword."""
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    if not isinstance(receiver, cst.Name):
        return {}
    flags: dict[str, dict[str, object]] = {}
    clashing: set[tuple[str, str]] = set()
    for node in descendants(site.scope):
        if node is site.statement:
            break
        method = _method_called_on(node, receiver.value)
        if method is None:
            continue
        assert isinstance(node, cst.Call)
        passed = flags.setdefault(method, {})
        for arg in node.args:
            if arg.keyword is None:
                continue
            known, value = _literal(arg.value)
            key = arg.keyword.value
            if not known or (key in passed and passed[key] != value):
                clashing.add((method, key))
            else:
                passed[key] = value
    for method, key in clashing:
        flags.get(method, {}).pop(key, None)
    return flags


def _literal(expr: cst.BaseExpression) -> tuple[bool, object]:
    """``(True, value)`` of a literal ``True``, ``False``, ``None``, string or integer."""
    if isinstance(expr, cst.Name) and expr.value in {"True", "False", "None"}:
        return True, {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, cst.SimpleString):
        return True, expr.evaluated_value
    if isinstance(expr, cst.Integer):
        return True, int(expr.value, 0)
    return False, None


def _method_called_on(node: cst.CSTNode, name: str) -> str | None:
    """The method ``node`` calls on the name ``name`` (``model.setup_caches(...)``), if any."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == name
    ):
        return node.func.attr.value
    return None


def methods_called_after(receiver: cst.BaseExpression, site: Site) -> frozenset[str]:
    """The methods called on the name ``receiver`` is by the statements that follow the one at
    ``site`` in its block (so they run whenever it does): ``model.setup_caches(...)`` after
    ``model.half()`` makes its parts again, in their own dtypes."""
    receiver = chain_root(receiver)
    if not isinstance(receiver, cst.Name):
        return frozenset()
    called = {
        method
        for statement in _following(site)
        for node in descendants(statement)
        if (method := _method_called_on(node, receiver.value)) is not None
    }
    return frozenset(called)


def _following(site: Site) -> list[cst.CSTNode]:
    """The statements after the one at ``site`` in the block that holds it (none in an
    expression's own line)."""
    statement = site.statement
    for node in descendants(site.scope):
        body = getattr(node, "body", None)
        if isinstance(body, (list, tuple)) and any(s is statement for s in body):
            index = next(i for i, s in enumerate(body) if s is statement)
            return [s for s in body[index + 1 :] if isinstance(s, cst.CSTNode)]
    return []


def handed_on(receiver: cst.BaseExpression, site: Site) -> bool:
    """Whether the scope calls the name ``receiver`` is, or passes it to a call, before the
    statement at ``site``: any method may have run on it then (``model(x)``, ``prepare(model)``)."""
    return next(hand_offs(receiver, site), None) is not None


def hand_offs(receiver: cst.BaseExpression, site: Site) -> Iterator[tuple[cst.Call, bool]]:
    """The calls before the statement at ``site`` that call the name ``receiver`` is (``model(x)``,
    with True) or pass it as an argument (``prepare(model)``, with False), in source order."""
    root = chain_root(receiver)
    if not isinstance(root, cst.Name):
        return
    name = root.value
    for node in descendants(site.scope):  # in source order
        if node is site.statement:
            return
        if not isinstance(node, cst.Call):
            continue
        if is_name(node.func, name):
            yield node, True
        elif any(is_name(a.value, name) for a in node.args):
            yield node, False


def constructed_here(
    prov: Provenance, receiver: cst.BaseExpression, site: Site, is_class: IsClass
) -> bool:
    """Whether ``receiver`` is a class ``is_class`` knows, built right here with no method run
    on it since: ``Transformer(args)`` (through device moves), or a local bound only to such a
    call on which the scope calls no method but casts and moves."""
    if methods_called(receiver, site) - _KEEPING:
        return False
    return _built(prov, receiver, site, is_class, 0)


def _built(
    prov: Provenance, receiver: cst.BaseExpression, site: Site, is_class: IsClass, depth: int
) -> bool:
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        if receiver.func.attr.value not in MODULE_CHAIN:
            return False
        receiver = receiver.func.value  # `Transformer(args).cuda().half()`
    if isinstance(receiver, cst.Call):
        return is_class(receiver.func, site)
    if not isinstance(receiver, cst.Name) or depth > 2:
        return False
    found = prov.lookup(receiver.value, site) or []
    return bool(found) and all(
        binding.kind == "assign"
        and isinstance(binding.value, cst.Call)
        and _built(prov, binding.value, binding_site, is_class, depth + 1)
        for binding, binding_site in found
    )
