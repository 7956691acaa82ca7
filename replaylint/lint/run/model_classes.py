"""The pre-filter's last stage: files that cast a model class of the project holding a gate buffer.

``loader.py`` may name no gate cache at all and still convert one: ``model.half()`` on a
``KimiModel`` imported from ``modeling.py``, whose layers register ``g_cache``. The first stages
rule such a file out, so this one looks for it by the names of the classes that hold a gate
buffer. It starts from the files that name a gate cache (they define the classes that register
one), summarises them, and keeps the classes whose cast would convert a gate buffer; then it
searches the other files for those class names, summarises the files that mention one (they may
define a model that holds such a class, a base class included), and repeats for the new names, a
few rounds at most (files that name a gate cache are searched too: a model class defined beside
its pool holds it). A file is analysed when it mentions one of the names, or of the project
classes they derive from (a mixin that casts ``self``), and contains a module cast call; the
analysis then decides from its imports. When the project has such classes, a file that casts a
module of no known class (``model: nn.Module``, ``self.to(...)``) is analysed as well.

A result cached for a file that was ruled out holds until that file changes: a class that starts
to hold a gate buffer later is seen by its importers when they change, or with ``--no-cache``.
The holders are found from the files read in the run, so in a run with the cache where no file
that names a gate cache changed, this stage does not run: a changed file that casts a model is
then analysed only when an earlier stage lets it through (``--no-cache`` sees it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.project.gate_buffers import (
    GENERIC_MODULE,
    MODULE_CAST_CALL,
    ImportedGateBuffer,
    class_gate_buffer,
    project_bases,
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
    """The files that may cast a module holding a gate buffer: those that contain a module cast
    call and mention a project class holding one (or a class such a class derives from), or,
    in a project with such classes, a module of no known class (``model: nn.Module``, a cast of
    ``self`` or of a receiver named like a model). ``naming_gate_caches`` are the files that
    name a gate cache, ``others`` the rest (ruled out so far); ``read`` returns a file's bytes
    (None when it cannot be read)."""
    examined: set[str] = set()
    holders: set[str] = set()
    bases: set[str] = set()
    buffers: set[str] = set()
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
    # a file naming a gate cache may define a model that holds one of the first holders
    naming = [path for path in naming_gate_caches if path not in set(frontier)]
    for _ in range(_ROUNDS):
        found = _holder_classes(index, names, frontier, examined)
        new = set(found) - holders
        if not new:
            break
        holders |= new
        if index.holder_example is None:
            index.holder_example = found[min(new)][0]
        buffers.update(found[name][0].name for name in new)
        new_bases = {base for name in new for base in found[name][1]} - bases - holders
        bases |= new_bases
        needles = sorted(name.lower().encode() for name in new | new_bases)
        if not all(needle.isascii() for needle in needles):
            break
        hits = files_containing([str(path) for path in [*rest, *naming]], needles, jobs)
        frontier = [path for path in [*rest, *naming] if str(path) in hits]
        mentioning.update(frontier)
        rest = [path for path in rest if str(path) not in hits]
        naming = [path for path in naming if str(path) not in hits]
    index.take_used()  # what the stage read is no file's dependency
    index.holder_names = frozenset(holders)
    index.holder_bases = frozenset(bases)
    index.holder_buffers = frozenset(buffers)
    casting: set[Path] = set()
    for path in mentioning:
        raw = read(path)
        if raw is None or MODULE_CAST_CALL.search(raw.decode("utf-8", "replace")):
            casting.add(path)  # an unreadable file goes to the analysis, which reports it
        elif (module := index.module_of(str(path))) is not None and index.calls_a_caster(
            module, raw.decode("utf-8", "replace")
        ):
            casting.add(path)  # `fabric.setup_module(model)`: a helper of the project casts it
    index.take_used()
    if holders:  # a cast of `model: nn.Module` may convert a holder's gate buffer too
        unmentioned = [*rest, *naming]
        generic = files_containing(
            [str(path) for path in unmentioned], [b"module", b"model", b"net"], jobs
        )
        for path in unmentioned:
            raw = read(path) if str(path) in generic else b""
            text = raw.decode("utf-8", "replace") if raw is not None else ""
            if raw is None or (GENERIC_MODULE.search(text) and MODULE_CAST_CALL.search(text)):
                casting.add(path)
    return casting


def _registers_gate_buffer(raw: bytes | None, names: GateCacheNames) -> bool:
    return raw is not None and registers_gate_buffer(raw.decode("utf-8", "replace"), names.matches)


def _holder_classes(
    index: ProjectIndex, names: GateCacheNames, paths: Sequence[Path], examined: set[str]
) -> dict[str, tuple[ImportedGateBuffer, set[str]]]:
    """The classes defined in ``paths`` whose cast converts a gate buffer, by name: the buffer,
    and the names of the project classes they derive from."""
    holders: dict[str, tuple[ImportedGateBuffer, set[str]]] = {}
    for path in paths:
        module = index.module_of(str(path))
        if module is None or module in examined:
            continue
        examined.add(module)
        summary = index.summary(module)
        for name, definition in summary["names"].items() if summary is not None else ():
            if definition[0] != "class":
                continue
            found = Found(module, name, definition, ())
            buffer = class_gate_buffer(index, names.matches, found)
            if buffer is not None:
                holders[name] = (buffer, project_bases(index, found))
    return holders
