"""Gate rings handed to the decode kernel through the project's own wrappers.

Real code seldom calls the decode kernel where its rings live. An op wrapper
(``def kda_step(x, state, d, k, la_cache): kernel(..., g_cache=la_cache)``), a layer method, a
registered custom op (``@torch.library.custom_op("ns::kda_step")``) or a record of the rings
(``Rings(d, k, forget)`` of a NamedTuple with a ``g_cache`` field) sits in between, and the
callers pass their ring positionally, under a name of their own (``kda_step(x, s, d, k,
self.forget_cache)``). A wrapper is a function, a class (through ``__init__``, or its dataclass
or NamedTuple fields) with a parameter that is a gate-cache name, or one whose body hands a
parameter to a decode entry point or to another wrapper as the gate cache. What a call of a
wrapper passes in that parameter's place is the gate ring, so its name is learned, which may make
more wrappers in turn; the stage stops when a round learns nothing new.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from replaylint.lint.gatecache.calls import (
    argument_for,
    dotted,
    entry_point_of,
    import_aliases,
    passed_name,
)
from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.learning import entry_point_needles
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.record_positions import record_fields
from replaylint.lint.syntax.ast_walk import walk
from replaylint.lint.syntax.limits import too_large

__all__ = ["Wrapper", "learned_from_wrappers", "names_passed_to", "wrappers_in"]

# Wrappers learned from calls of wrappers learned from calls ...: a project nests a few at most.
_ROUNDS = 4


@dataclass(frozen=True)
class Wrapper:
    """A callable of the project that takes the gate ring: its called name and the parameter."""

    function: str
    parameter: str
    index: int | None
    """The parameter's place among a call's positional arguments; None: keyword only."""


def wrappers_in(
    tree: ast.Module,
    names: GateCacheNames,
    entry_points: Sequence[EntryPoint],
    known: dict[str, Wrapper],
) -> Iterator[Wrapper]:
    """The wrappers ``tree`` defines, with ``known`` wrappers (by called name) as callees."""
    aliases = import_aliases(tree)
    yield from _defined(tree.body, None, names, entry_points, known, aliases)


def _defined(
    body: Sequence[ast.stmt],
    owner: ast.ClassDef | None,
    names: GateCacheNames,
    entry_points: Sequence[EntryPoint],
    known: dict[str, Wrapper],
    aliases: dict[str, str],
) -> Iterator[Wrapper]:
    for statement in body:
        if isinstance(statement, ast.ClassDef):
            yield from _fields(statement, names)
            yield from _defined(statement.body, statement, names, entry_points, known, aliases)
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            called = _called_names(statement, owner)
            if not called:
                continue
            for parameter, index in _gate_parameters(
                statement, owner, names, entry_points, known, aliases
            ):
                for function in called:
                    yield Wrapper(function, parameter, index)


def _called_names(
    function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None
) -> list[str]:
    """The names a call of ``function`` is written with: its own, its class's for ``__init__``,
    the op name it is registered under as a custom op."""
    if function.name == "__init__":
        return [owner.name] if owner is not None else []
    if function.name.startswith("__") or function.name == "_":
        return []
    called = [function.name]
    for decorator in function.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and (dotted(decorator.func) or "").rpartition(".")[2] == "custom_op"
            and decorator.args
            and isinstance(op := decorator.args[0], ast.Constant)
            and isinstance(op.value, str)
        ):
            registered = op.value.rpartition("::")[2]
            if registered.isidentifier() and registered not in called:
                called.append(registered)
    return called


def _positional(
    function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None
) -> list[str]:
    """The parameters a call fills by position, without the bound ``self``/``cls``."""
    parameters = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]]
    static = any(dotted(d) == "staticmethod" for d in function.decorator_list)
    if owner is not None and not static and parameters:
        parameters = parameters[1:]
    return parameters


def _gate_parameters(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    owner: ast.ClassDef | None,
    names: GateCacheNames,
    entry_points: Sequence[EntryPoint],
    known: dict[str, Wrapper],
    aliases: dict[str, str],
) -> Iterator[tuple[str, int | None]]:
    positional = _positional(function, owner)
    keyword_only = [arg.arg for arg in function.args.kwonlyargs]
    handed = set(_handed_to_the_kernel(function, entry_points, known, aliases))
    for place, parameter in enumerate(positional):
        if _takes_the_gate_ring(parameter, names) or parameter in handed:
            yield parameter, place
    for parameter in keyword_only:
        if _takes_the_gate_ring(parameter, names) or parameter in handed:
            yield parameter, None


def _takes_the_gate_ring(parameter: str, names: GateCacheNames) -> bool:
    # a plural (`g_caches`) is a list of rings, not the ring a caller passes
    return names.matches(parameter) and not names.is_plural(parameter)


def _handed_to_the_kernel(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    entry_points: Sequence[EntryPoint],
    known: dict[str, Wrapper],
    aliases: dict[str, str],
) -> Iterator[str]:
    """Names the body passes as the gate cache of an entry point or of a known wrapper."""
    for node in walk(function):
        if not isinstance(node, ast.Call):
            continue
        written = dotted(node.func)
        entry = entry_point_of(written, aliases, entry_points)
        if entry is not None:
            argument = argument_for(node, entry.parameter, entry.index)
        else:
            wrapper = known.get(_last_part(node.func) or "")
            argument = (
                None if wrapper is None else argument_for(node, wrapper.parameter, wrapper.index)
            )
        if isinstance(argument, ast.Name):
            yield argument.id


def _fields(record: ast.ClassDef, names: GateCacheNames) -> Iterator[Wrapper]:
    """A dataclass's or NamedTuple's gate-ring field, filled by position in a construction."""
    if any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in record.body):
        return  # its own __init__ says what a call passes
    for place, field in enumerate(record_fields(record) or ()):
        if field and _takes_the_gate_ring(field, names):
            yield Wrapper(record.name, field, place)


def names_passed_to(
    tree: ast.AST, filename: str, wrappers: dict[str, Wrapper]
) -> Iterator[tuple[str, LearnedFrom]]:
    """The names ``tree``'s calls of ``wrappers`` pass in the gate ring's place."""
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        wrapper = wrappers.get(_last_part(node.func) or "")
        if wrapper is None:
            continue
        argument = argument_for(node, wrapper.parameter, wrapper.index)
        name = None if argument is None else passed_name(argument)
        others = [*node.args, *(keyword.value for keyword in node.keywords)]
        if name is None or any(o is not argument and passed_name(o) == name for o in others):
            continue
        reason = f"passed as `{wrapper.parameter}` of `{wrapper.function}`"
        yield name, LearnedFrom(filename, node.lineno, "", reason)


def _last_part(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def learned_from_wrappers(
    paths: Sequence[str],
    names: GateCacheNames,
    entry_points: Sequence[EntryPoint],
    read: Callable[[str], str | None],
    learnable: Callable[[str], bool],
    jobs: int = 1,
    kernel_callers: Sequence[str] | None = None,
) -> dict[str, LearnedFrom]:
    """Names the project's calls of its wrappers pass for the gate ring; not ones ``names``
    (with what it learned so far) matches already. ``paths`` are the project's files.

    Wrappers are looked for where the kernel is called and then where a wrapper is: the files
    that contain an entry point's text, then the files whose calls of wrappers were read. A
    file is parsed only when grep and a search of its text find such a call in it, so a large
    tree costs a few parses. ``kernel_callers``, when given, holds every file that may contain
    an entry point's text (the run's first search already found them): only those are searched
    for it."""
    learned: dict[str, LearnedFrom] = {}
    wrappers: dict[str, Wrapper] = {}
    ambiguous: set[str] = set()
    files = _Files(paths, read, jobs)
    kernels = [n for n in entry_point_needles(entry_points) or [] if n.isidentifier()]
    scanned = files.matching(
        [kernel.lower().encode() for kernel in kernels], lambda text: True, among=kernel_callers
    )
    # ... and where a definition takes a learned name as a parameter (`from_tensors(log_alpha)`)
    taking = [name for name in sorted(names.learned) if name.isascii()]
    if taking:
        seen = {path for path, _ in scanned}
        taken = "|".join(re.escape(name) for name in taking)
        header = re.compile(rf"\bdef\s+\w+\s*\([^)]*\b(?:{taken})\b")
        more = files.matching(
            [name.lower().encode() for name in taking], lambda text: bool(header.search(text))
        )
        scanned += [(path, tree) for path, tree in more if path not in seen]
    for _ in range(_ROUNDS):
        current = names.with_learned(learned)
        found: dict[str, Wrapper] = {}
        for _path, tree in scanned:
            for wrapper in wrappers_in(tree, current, entry_points, wrappers):
                if wrapper.function in wrappers or wrapper.function in ambiguous:
                    continue
                other = found.setdefault(wrapper.function, wrapper)
                if other != wrapper:  # two definitions disagree: no place is sure
                    ambiguous.add(wrapper.function)
        fresh = {name: w for name, w in found.items() if name not in ambiguous}
        if not fresh:
            break
        wrappers.update(fresh)
        calls = [f"{name}(" for name in sorted(fresh)]
        callers = files.matching(
            [call.lower().encode() for call in calls], functools.partial(_calls_one_of, calls=calls)
        )
        for path, tree in callers:
            for name, origin in names_passed_to(tree, path, fresh):
                if not current.matches(name) and learnable(name):
                    learned.setdefault(name, origin)
        # wrappers of wrappers are defined where wrappers are called
        scanned = callers
    return learned


class _Files:
    """The project's files, each read and parsed at most once."""

    def __init__(self, paths: Sequence[str], read: Callable[[str], str | None], jobs: int) -> None:
        self.paths, self.read, self.jobs = paths, read, jobs
        self.texts: dict[str, str | None] = {}
        self.trees: dict[str, ast.Module | None] = {}

    def matching(
        self,
        needles: list[bytes],
        wanted: Callable[[str], bool],
        among: Sequence[str] | None = None,
    ) -> list[tuple[str, ast.Module]]:
        """The files (path order; of ``among`` when given) that contain a needle and whose text
        is ``wanted``, parsed."""
        found = []
        needles = [needle for needle in needles if needle.isascii()]
        paths = self.paths if among is None else among
        for path in sorted(files_containing(paths, needles, self.jobs)):
            if path not in self.texts:
                text = self.read(path)
                # a file too large to parse safely is reported by the checking pass
                self.texts[path] = text if text is not None and too_large(text) is None else None
            text = self.texts[path]
            if text is None or not wanted(text):
                continue
            if path not in self.trees:
                self.trees[path] = None
                with contextlib.suppress(SyntaxError, ValueError, RecursionError, MemoryError):
                    self.trees[path] = ast.parse(text)
            if (tree := self.trees[path]) is not None:
                found.append((path, tree))
        return found


def _calls_one_of(text: str, *, calls: Sequence[str]) -> bool:
    """Whether ``text`` writes one of ``calls`` (``kda_step(``) as a whole name: ``ops.kda_step(``
    is one, ``my_kda_step(`` is not."""
    for call in calls:
        start = text.find(call)
        while start >= 0:
            if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                return True
            start = text.find(call, start + 1)
    return False
