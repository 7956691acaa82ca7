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
    unpacking: list[tuple[str, cst.Tuple | cst.List]] = []
    functions: dict[str, list[cst.FunctionDef]] = {}
    for node in descendants(module):
        target: cst.BaseExpression | None = None
        if isinstance(node, cst.FunctionDef):
            functions.setdefault(node.name.value, []).append(node)
        elif isinstance(node, cst.Call) and method_name(node) in ADDED_ELEMENT:
            assert isinstance(node.func, cst.Attribute)
            target = node.func.value
        elif isinstance(node, (cst.Assign, cst.AnnAssign)) and isinstance(
            node.value, (cst.List, cst.ListComp)
        ):
            targets = node.targets if isinstance(node, cst.Assign) else ()
            target = node.target if isinstance(node, cst.AnnAssign) else None
            if len(targets) == 1:
                target = targets[0].target
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            unpacking.extend(_unpacked_from_call(node, names))
        name = binding_name(target) if target is not None else None
        if name is not None and names.matches(name):
            found.add(name)
    # `self._d, self._gate = self._init_caches()` of a method that appends to `gate` and returns
    # `d, gate`: the names in the places where it returns a list it builds
    for called, written in unpacking:
        positions = {p for function in functions.get(called, ()) for p in _list_positions(function)}
        for position, element in enumerate(written.elements):
            name = binding_name(element.value)
            if position in positions and name is not None and names.matches(name):
                found.add(name)
    return frozenset(found)


def _unpacked_from_call(
    node: cst.Assign, names: GateCacheNames
) -> list[tuple[str, cst.Tuple | cst.List]]:
    """The called function's name and each tuple target of ``a, g_cache = f(...)`` that
    unpacks a gate-cache name."""
    assert isinstance(node.value, cst.Call)
    called = method_name(node.value) or binding_name(node.value.func) or ""
    return [
        (called, target.target)
        for target in node.targets
        if isinstance(target.target, (cst.Tuple, cst.List))
        and any(
            (name := binding_name(e.value)) is not None and names.matches(name)
            for e in target.target.elements
        )
    ]


def _list_positions(function: cst.FunctionDef) -> set[int]:
    """The positions of the tuples ``function`` returns that hold a list it builds."""
    built = _built_lists(function)
    return {
        position
        for node in descendants(function.body)
        if isinstance(node, cst.Return) and isinstance(node.value, cst.Tuple)
        for position, element in enumerate(node.value.elements)
        if isinstance(element.value, cst.Name) and element.value.value in built
    }


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
