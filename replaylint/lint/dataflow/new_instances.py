"""A module instance built right here, and the methods the scope calls on it.

A cast converts the buffers the instance holds when it is cast. Right after construction that
is what the constructor registered: buffers a later method makes (``setup_cache``) are not
there yet, and a cast of ``Transformer(args)`` leaves them to be allocated in their own dtype
(:mod:`replaylint.lint.project.buffer_makers` tells which method makes each buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.instances import MODULE_CHAIN
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
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name)
            and node.func.value.value == receiver.value
        ):
            called.add(node.func.attr.value)
    return frozenset(called)


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
