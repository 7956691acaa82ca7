"""The pre-filter's last stage: files that cast a model class of the project holding a gate buffer.

``loader.py`` may name no gate cache at all and still convert one: ``model.half()`` on a
``KimiModel`` imported from ``modeling.py``, whose layers register ``g_cache``. The first stages
rule such a file out, so this one looks for it by the names of the classes that hold a gate
buffer. It starts from the files that name a gate cache (they define the classes that register
one), summarises them, and keeps the classes whose cast would convert a gate buffer; then it
searches the other files for those class names, summarises the files that mention one (they may
define a model that holds such a class, a base class included), and repeats for the new names, a
few rounds at most. A file the first stages ruled out is analysed when it mentions one of the
names and contains a module cast call; the analysis then decides from its imports.

A result cached for a file that was ruled out holds until that file changes: a class that starts
to hold a gate buffer later is seen by its importers when they change, or with ``--no-cache``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.project.gate_buffers import (
    MODULE_CAST_CALL,
    class_gate_buffer,
    registers_gate_buffer,
)
from replaylint.lint.project.index import Found, ProjectIndex

_ROUNDS = 3


def model_casting_files(
    index: ProjectIndex,
    names: GateCacheNames,
    naming_gate_caches: Sequence[Path],
    others: Sequence[Path],
    jobs: int,
    read: Callable[[Path], bytes | None],
) -> set[Path]:
    """The files of ``others`` (ruled out so far) that mention a project class holding a gate
    buffer and contain a module cast call. ``naming_gate_caches`` are the files that name a gate
    cache; ``read`` returns a file's bytes (None when it cannot be read)."""
    examined: set[str] = set()
    holders: set[str] = set()
    mentioning: set[Path] = set()
    # only a file whose text registers a buffer named like a gate cache defines a first holder
    registering = files_containing(
        [str(path) for path in naming_gate_caches], [b"register_buffer", b"buffer("], jobs
    )
    frontier = [
        path
        for path in naming_gate_caches
        if str(path) in registering and _registers_gate_buffer(read(path), names)
    ]
    rest = list(others)
    for _ in range(_ROUNDS):
        found = _holder_classes(index, names, frontier, examined) - holders
        if not found:
            break
        holders |= found
        needles = sorted(name.lower().encode() for name in found)
        if not all(needle.isascii() for needle in needles):
            break
        hits = files_containing([str(path) for path in rest], needles, jobs)
        frontier = [path for path in rest if str(path) in hits]
        mentioning.update(frontier)
        rest = [path for path in rest if str(path) not in hits]
    index.take_used()  # what the stage read is no file's dependency
    index.holder_names = frozenset(holders)
    casting: set[Path] = set()
    for path in mentioning:
        raw = read(path)
        if raw is None or MODULE_CAST_CALL.search(raw.decode("utf-8", "replace")):
            casting.add(path)  # an unreadable file goes to the analysis, which reports it
    return casting


def _registers_gate_buffer(raw: bytes | None, names: GateCacheNames) -> bool:
    return raw is not None and registers_gate_buffer(raw.decode("utf-8", "replace"), names.matches)


def _holder_classes(
    index: ProjectIndex, names: GateCacheNames, paths: Sequence[Path], examined: set[str]
) -> set[str]:
    """Names of the classes defined in ``paths`` whose cast converts a gate buffer."""
    holders: set[str] = set()
    for path in paths:
        module = index.module_of(str(path))
        if module is None or module in examined:
            continue
        examined.add(module)
        summary = index.summary(module)
        for name, definition in summary["names"].items() if summary is not None else ():
            if definition[0] != "class":
                continue
            if (
                class_gate_buffer(index, names.matches, Found(module, name, definition, ()))
                is not None
            ):
                holders.add(name)
    return holders
