"""Which gate-cache names hold a list of rings, not one ring: ``self.g_caches[layer] = ring``
replaces an element of such a list (a binding of the gate cache), while ``g_cache[slot] = x``
writes into a tensor (a copy, which casts).

A name holds a list when the module binds it to a list literal or comprehension, adds to it
(``append``, ``insert``, ``extend``), or unpacks it from a call of one of its functions at a
place where that function returns a list it builds (``self._d, self._gate =
self._init_caches()``). :func:`maybe_list_words` is the cheap superset read from the text, so
the tree is walked only for a name it lists.
"""

from __future__ import annotations

import re

import libcst as cst

from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.syntax.nodes import binding_name, method_name
from replaylint.lint.syntax.traversal import descendants

ADDED_ELEMENT = {"append": 0, "insert": 1, "extend": 0}
"""List methods that add an element, with the position of the element among their arguments."""

# A word the text binds to a list (`name = [...]`, `name: T = [...]`) or adds to (`name.append(`).
_LIST_WORD = re.compile(
    r"\b(\w+)\b\s*(?:\.\s*(?:append|insert|extend)\s*\(|(?::[^=\n]*)?=\s*[(\s]*\[)"
)
# Names unpacked from a call (`self.d, self.g = self._make_rings()`): lists when it returns lists.
_UNPACKED_FROM_CALL = re.compile(
    r"^[ \t]*((?:[\w.]+[ \t]*,[ \t]*)+[\w.]+)[ \t]*=[ \t]*[\w.]+\(", re.M
)


def maybe_list_words(source: str) -> frozenset[str]:
    """Every name the text may bind to a list or add to: a superset of what
    :func:`list_names` finds, read in one pass over the text instead of a walk of the tree."""
    words = {match.group(1) for match in _LIST_WORD.finditer(source)}
    for match in _UNPACKED_FROM_CALL.finditer(source):
        words.update(part.strip().rpartition(".")[2] for part in match.group(1).split(","))
    return frozenset(words)


def list_names(module: cst.Module, names: GateCacheNames) -> frozenset[str]:
    found: set[str] = set()
    for node in descendants(module):
        target: cst.BaseExpression | None = None
        if isinstance(node, cst.Call) and method_name(node) in ADDED_ELEMENT:
            assert isinstance(node.func, cst.Attribute)
            target = node.func.value
        elif isinstance(node, (cst.Assign, cst.AnnAssign)) and isinstance(
            node.value, (cst.List, cst.ListComp)
        ):
            targets = node.targets if isinstance(node, cst.Assign) else ()
            target = node.target if isinstance(node, cst.AnnAssign) else None
            if len(targets) == 1:
                target = targets[0].target
        name = binding_name(target) if target is not None else None
        if name is not None and names.matches(name):
            found.add(name)
    found.update(_unpacked_lists(module, names))
    return frozenset(found)


def _unpacked_lists(module: cst.Module, names: GateCacheNames) -> set[str]:
    """Gate-cache names unpacked from a call of a function of the module at a place where it
    returns a list it builds (``self._d, self._gate = self._init_caches()`` of a method that
    appends to ``gate`` and returns ``d, gate``)."""
    positions: dict[str, set[int]] = {}
    for node in descendants(module):
        if not isinstance(node, cst.FunctionDef):
            continue
        built = _built_lists(node)
        for inner in descendants(node.body):
            if isinstance(inner, cst.Return) and isinstance(inner.value, cst.Tuple):
                for position, element in enumerate(inner.value.elements):
                    if isinstance(element.value, cst.Name) and element.value.value in built:
                        positions.setdefault(node.name.value, set()).add(position)
    found: set[str] = set()
    for node in descendants(module) if positions else ():
        if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)):
            continue
        called = method_name(node.value) or binding_name(node.value.func) or ""
        for target in node.targets if called in positions else ():
            if isinstance(target.target, (cst.Tuple, cst.List)):
                for position, element in enumerate(target.target.elements):
                    name = binding_name(element.value)
                    if position in positions[called] and name is not None and names.matches(name):
                        found.add(name)
    return found


def _built_lists(function: cst.FunctionDef) -> set[str]:
    """Local names a function binds to a list or appends to."""
    built: set[str] = set()
    for node in descendants(function.body):
        if isinstance(node, cst.Call) and method_name(node) in ADDED_ELEMENT:
            assert isinstance(node.func, cst.Attribute)
            if isinstance(node.func.value, cst.Name):
                built.add(node.func.value.value)
        elif isinstance(node, cst.Assign) and isinstance(node.value, (cst.List, cst.ListComp)):
            built.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))
    return built
