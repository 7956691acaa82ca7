"""The entry a string key reads from a dict literal the scope builds once and never writes
again: ``rings = {"d": torch.zeros(shape, dtype=dtype), "gate": torch.zeros(shape, dtype=dtype)}``
then ``self.g_cache = rings["gate"]`` (or ``rings.pop("gate")``, ``rings.get("gate")``).

Keys like ``"gate"`` name no gate cache, so the rules that follow cache names never look at such
a dict; the tensor the key reads is the literal's value for it, whose fix is its own. (A dict
comprehension's entry is RL006's: its value is shared by the other keys.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import strings
from replaylint.lint.dataflow.facts import TensorFact
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.syntax.nodes import entries_rewritten, is_name, method_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["entry_facts"]

_EMPTYING = frozenset({"clear", "popitem"})


def entry_facts(
    prov: Provenance, mapping: cst.BaseExpression, key: str, site: Site, env: Env
) -> tuple[TensorFact, ...] | None:
    """The facts of ``mapping[key]``; None when ``mapping`` is not such a dict or the entry is
    not known."""
    if not isinstance(mapping, cst.Name):
        return None
    found = prov.lookup(mapping.value, site, env)
    if not found or len(found) != 1:
        return None
    binding, built_at = found[0]
    value = binding.value
    if (
        binding.kind != "assign"
        or not isinstance(value, cst.Dict)
        or built_at.scope is not site.scope
    ):
        return None  # a dict of another scope may be written anywhere that scope reaches
    if _written(mapping.value, site.scope, binding.node):
        return None
    return _literal_entry(prov, value, key, built_at, env)


def _literal_entry(
    prov: Provenance, value: cst.Dict, key: str, site: Site, env: Env
) -> tuple[TensorFact, ...] | None:
    entry: cst.BaseExpression | None = None
    for element in value.elements:
        if not isinstance(element, cst.DictElement):
            return None  # `**spread`: its keys are not known
        written = strings.string_value(prov, element.key, site, env)
        if written is None:
            return None
        if written == key:
            entry = element.value  # a later duplicate wins
    return None if entry is None else prov.tensor_facts(entry, site, env)


def _written(name: str, scope: cst.CSTNode, bound: cst.CSTNode) -> bool:
    """Whether ``scope`` writes an entry of the dict ``name`` (item assignment, ``update``,
    :func:`~replaylint.lint.syntax.nodes.entries_rewritten`; an augmented item assignment, a
    deletion, ``clear``, ``popitem``) or binds it again."""
    if entries_rewritten(scope, name):
        return True
    for node in descendants(scope):
        if isinstance(node, cst.Call) and method_name(node) in _EMPTYING:
            func = node.func
            if isinstance(func, cst.Attribute) and is_name(func.value, name):
                return True
        elif isinstance(node, cst.AugAssign):
            target = node.target
            if is_name(target.value if isinstance(target, cst.Subscript) else target, name):
                return True
        elif isinstance(node, cst.AssignTarget) and is_name(node.target, name):
            if node.target is not bound:
                return True
        elif (
            isinstance(node, cst.Del)
            and isinstance(node.target, cst.Subscript)
            and is_name(node.target.value, name)
        ):
            return True
    return False
