"""Gate rings a decode path takes from a getter of another module: ``d, k, g = cache.rings(i)``.

When the name unpacked in the gate ring's place is a gate cache (learned from the decode call
that takes it), what the getter returns in that place is the gate ring too, under the names its
own module uses (``return self.d_states[i], self.k_states[i], self.decay_states[i]``). Such a
module need not name a gate cache anywhere, so the first pass never read it: this stage finds the
getters in the files that taught names, reads the files that define them, and learns the names
they return in the gate ring's place (and the rings those files write in the gate ring's place,
:mod:`replaylint.lint.gatecache.ring_order`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.learning import learnable
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.ring_order import gate_rings_by_order, written_name
from replaylint.lint.run.files import FileProblem, read_source

# `a, b, g = obj.method(...)` (three or four targets), captured: the targets and the method
_UNPACKED_CALL = re.compile(
    r"^[ \t]*((?:[A-Za-z_]\w*[ \t]*,[ \t]*){2,3}[A-Za-z_]\w*)[ \t]*=[ \t]*[\w.]+\.(\w+)\(",
    re.MULTILINE,
)


def learned_from_getters(
    paths: Sequence[str], names: GateCacheNames, merged: dict[str, LearnedFrom], jobs: int
) -> dict[str, LearnedFrom]:
    """Names the getters return that the files which taught ``merged`` unpack rings from; not
    ones already known. ``paths`` are the run's readable files."""
    if not merged:
        return {}
    taught = {origin.filename for origin in merged.values()}
    texts = [text for path in sorted(taught) if (text := read_text(path)) is not None]
    getters = ring_getters(texts, names.with_learned(merged))
    if not getters:
        return {}
    found = names_from_getters(paths, getters, read_text, jobs)
    return {n: o for n, o in found.items() if n not in merged and learnable(n, names)}


def ring_getters(texts: Sequence[str], names: GateCacheNames) -> dict[str, tuple[int, int]]:
    """Method name -> (place of the gate ring, number of targets) for every unpacking of a
    method's result in ``texts`` whose target in some place is a gate cache."""
    getters: dict[str, tuple[int, int]] = {}
    for text in texts:
        for found in _UNPACKED_CALL.finditer(text):
            targets = [t.strip() for t in found.group(1).split(",")]
            places = [i for i, t in enumerate(targets) if names.matches(t)]
            if len(places) == 1 and not found.group(2).startswith("__"):
                getters.setdefault(found.group(2), (places[0], len(targets)))
    return getters


def names_from_getters(
    paths: Sequence[str],
    getters: dict[str, tuple[int, int]],
    read: Callable[[str], str | None],
    jobs: int,
) -> dict[str, LearnedFrom]:
    """What the project's definitions of ``getters`` return in the gate ring's place, and the
    rings their files write in it."""
    defining = files_containing(paths, [f"def {name}(".encode() for name in getters], jobs)
    learned: dict[str, LearnedFrom] = {}
    for path in sorted(defining):
        text = read(path)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in getters:
                place, count = getters[node.name]
                for name, row in _returned_at(node, place, count):
                    reason = f"returned by `{node.name}` in the gate ring's place"
                    learned.setdefault(name, LearnedFrom(path, row, "", reason))
        for name, origin in gate_rings_by_order(tree, path):
            learned.setdefault(name, origin)
    return learned


def _returned_at(function: ast.FunctionDef, place: int, count: int) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            elements = node.value.elts
            if len(elements) == count and (name := written_name(elements[place])) is not None:
                found.append((name, node.lineno))
    return found


def read_text(path: str) -> str | None:
    """The decoded text of the file at ``path`` (its encoding declaration honoured), or None."""
    try:
        return read_source(Path(path)).text
    except FileProblem:
        return None
