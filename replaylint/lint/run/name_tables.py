"""Module and class constants that list cache names, a gate cache's among them
(``TENSOR_FIELDS = ("ssm_state", "d_ring", "k_ring", "log_gate_ring")``), and functions or
methods that return such a literal (``def ring_shapes(self): return {"d_cache": ..., "g_cache":
...}``), and generator methods that yield their own tensors (``yield name, getattr(self, name)``):
a file that imports one, or calls the method on an instance, and loops over it makes, casts or
loads the gate cache without naming it, so the pre-filter, which looks for gate-cache names, must
let it through. Found in the files that name a gate cache, and remembered in the result cache
under their sizes and times and the names learned so far."""

from __future__ import annotations

import ast
import bisect
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.names import GATE_FIELD_WORDS, GateCacheNames
from replaylint.lint.run.cache import ResultCache

__all__ = ["files_reading", "name_table_constants", "tables_in"]

# a constant of a module or a class (``ReplayCache.BUFFER_NAMES``) bound to a bracketed literal:
# the cheap test before a parse
_CONSTANT_TABLE = re.compile(
    rb"^[ \t]*(?P<statement>_*[A-Z][A-Z0-9_]*\s*(?::[^=\n]*)?=\s*[(\[{])", re.MULTILINE
)
# a quoted identifier: what a listed cache name looks like before the parse confirms it
_QUOTED_WORD = re.compile(rb"""['"]([A-Za-z_][A-Za-z0-9_]*)['"]""")
# `return (...)`/`return {...}` in a function: the function's name is the table's
_RETURNED_TABLE = re.compile(rb"^[ \t]+return[ \t]*(?=[(\[{])", re.MULTILINE)
_DEFINITION = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_CLASS = re.compile(rb"^[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
# a record's field for the gate ring's dtype, as the pre-filter recognises it
# (searched from the annotation, which starts with a literal `:`, and then the line's start is
# checked: many times faster than a pattern anchored at every line's start)
_DTYPE_ANNOTATION = re.compile(rb":[ \t]*(?:Optional\[[ \t]*)?(?:torch\.)?dtype\b", re.IGNORECASE)
_GATE_FIELD_NAME = re.compile(
    rb"[ \t]+(?:" + b"|".join(w.encode() for w in sorted(GATE_FIELD_WORDS)) + rb")[ \t]*",
    re.IGNORECASE,
)
# a generator method yielding its own tensors by name (`yield name, getattr(self, name)`, `yield
# "state", self.state`): a loop over it walks the rings without naming them
# (:mod:`replaylint.lint.project.yielded`)
_YIELDS_OWN = re.compile(
    rb"^[ \t]+yield[ \t]+(?:[\"'][\w.]+[\"']|\w+(?:\.name)?)[ \t]*,[ \t]*"
    rb"(?:self\.\w+|getattr\(\s*self\b)",
    re.MULTILINE,
)
# walks every module or container has: their names are in nearly every file
_COMMON_WALKS = frozenset(
    {
        "__iter__", "__next__", "items", "keys", "values", "buffers", "named_buffers",
        "parameters", "named_parameters", "children", "named_children", "modules",
        "named_modules", "state_dict",
    }
)  # fmt: skip
_LONGEST_TABLE = 20_000  # bytes: a constant longer than this is data, not a list of cache names
_BRACKET = re.compile(rb"[()\[\]{}]")


def name_table_constants(
    paths: Sequence[str] | Callable[[], Sequence[str]],
    needles: Sequence[bytes] | None,
    stamps: Sequence[tuple[str, int, int, int]],
    names: GateCacheNames,
    cache: ResultCache | None,
    jobs: int,
    found: Callable[[], frozenset[str]] | None = None,
) -> frozenset[str]:
    """The names of the module constants of ``paths`` that list a gate cache's name; only the
    files holding one of ``needles`` (the pre-filter's, None: every file) are read. ``paths``
    may instead be a function giving the files already known to hold one (the run read them
    all). ``stamps``: (path, size, mtime, ctime) of every file of the run, what a stored answer
    is keyed on. ``found``: the answer, when the files were searched as they were read (with
    these ``names``), so that none is read again."""
    key = None
    if cache is not None:
        learned = sorted(names.learned)
        digest = hashlib.blake2b(repr(("tables", sorted(stamps), learned)).encode(), digest_size=12)
        key = digest.hexdigest()
        hit, stored = cache.stage(key)
        if hit and isinstance(stored, list) and all(isinstance(s, str) for s in stored):
            return frozenset(stored)
    tables = set(found()) if found is not None else _read_tables(paths, needles, names, jobs)
    if cache is not None and key is not None:
        cache.put_stage(key, sorted(tables))
    return frozenset(tables)


def _read_tables(
    paths: Sequence[str] | Callable[[], Sequence[str]],
    needles: Sequence[bytes] | None,
    names: GateCacheNames,
    jobs: int,
) -> set[str]:
    if callable(paths):
        naming = set(paths())
    else:
        naming = set(paths) if needles is None else files_containing(paths, needles, jobs)
    tables: set[str] = set()
    for path in sorted(naming):
        try:
            raw = Path(path).read_bytes()
        except OSError:
            continue  # the analysis reports it
        tables |= tables_in(raw, names)
    return tables


def files_reading(paths: Sequence[str], tables: frozenset[str], jobs: int) -> set[str]:
    """The files of ``paths`` that mention one of the constants ``tables``."""
    needles = sorted(name.lower().encode() for name in tables)
    if not needles or not all(needle.isascii() for needle in needles):
        return set(paths) if needles else set()
    return files_containing(paths, needles, jobs)


def tables_in(raw: bytes, names: GateCacheNames) -> set[str]:
    """The constants of ``raw`` that list a gate cache's name; each candidate statement is cut
    out at its closing bracket and parsed alone (a whole module would cost a parse per file).
    Also the record classes that declare a field for the gate ring's dtype (``g: torch.dtype``):
    a file that builds one (``RingDtypes(d=ring, k=ring, g=ring)``) sets that dtype without
    naming a gate cache; and the record classes with a gate-cache tensor field, which a file can
    fill from a spread mapping without naming the field."""
    found = _dtype_records(raw) | _own_walks(raw) | _ring_records(raw, names)
    if raw.isascii() and not any(
        names.matches(word.decode("ascii")) for word in set(_QUOTED_WORD.findall(raw))
    ):
        return found  # quotes no gate-cache name: no table can list one
    for match in _CONSTANT_TABLE.finditer(raw):
        end = _closing(raw, match.end() - 1)
        if end is None:
            continue
        text = raw[match.start("statement") : end + 1]
        if text.isascii() and not any(
            names.matches(word.decode("ascii")) for word in _QUOTED_WORD.findall(text)
        ):
            continue  # lists no gate-cache name: no parse needed
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue  # not a whole statement (a bracket in a string): not followed
        statement = tree.body[0] if len(tree.body) == 1 else None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and any(names.matches(e) for e in _listed(value)):
            found.add(target.id)
    functions = _Enclosing(raw, _DEFINITION)
    for match in _RETURNED_TABLE.finditer(raw):
        if _literal_at(raw, match.end(), names) and (name := functions.at(match.start())):
            found.add(name)  # the function that returns the literal
    return found


def _own_walks(raw: bytes) -> set[str]:
    """The generator methods of ``raw`` that yield their own attributes (``def
    named_states(self): ... yield name, getattr(self, name)``), but for walks every module has."""
    found: set[str] = set()
    functions = _Enclosing(raw, _DEFINITION)
    for match in _YIELDS_OWN.finditer(raw):
        name = functions.at(match.start())
        if name is not None and name not in _COMMON_WALKS and len(name) >= 5:
            found.add(name)
    return found


def _dtype_records(raw: bytes) -> set[str]:
    """The classes of ``raw`` whose body declares a gate-dtype field (``g: torch.dtype``)."""
    fields = []
    for annotation in _DTYPE_ANNOTATION.finditer(raw):
        line = raw.rfind(b"\n", 0, annotation.start()) + 1
        if _GATE_FIELD_NAME.fullmatch(raw, line, annotation.start()):
            fields.append(line)
    if not fields:
        return set()
    classes = _Enclosing(raw, _CLASS)
    return {name for field in fields if (name := classes.at(field)) is not None}


# a record's tensor field (`alpha_log_cache: torch.Tensor`), one per line
# (a whole line: a parameter of a signature ends in a comma or a default)
_TENSOR_FIELD = re.compile(
    rb"^[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*:[ \t]*(?:Optional\[[ \t]*)?(?:torch\.)?Tensor\]?"
    rb"[ \t]*(?:#[^\n]*)?$",
    re.MULTILINE,
)
# a class or a function: the nearest one above a field must be the class
_CLASS_OR_DEF = re.compile(
    rb"^[ \t]*((?:class|def|async[ \t]+def)[ \t]+[A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE
)
_RECORD_WORDS = (b"dataclass", b"NamedTuple")


def _ring_records(raw: bytes, names: GateCacheNames) -> set[str]:
    """The record classes of ``raw`` with a gate-cache tensor field (``alpha_log_cache:
    torch.Tensor`` in a dataclass or NamedTuple): a file that fills one from a spread mapping
    (``LayerCache(**{name: t.to(dtype) for ...})``) makes the gate cache without naming it."""
    if not any(word in raw for word in _RECORD_WORDS):
        return set()
    fields = [
        match.start()
        for match in _TENSOR_FIELD.finditer(raw)
        if names.matches(match.group(1).decode("ascii", "replace"))
    ]
    if not fields:
        return set()
    definitions = _Enclosing(raw, _CLASS_OR_DEF)
    return {
        name.split()[-1]
        for field in fields
        if (name := definitions.at(field)) is not None and name.startswith("class")
    }


class _Enclosing:
    """The definitions (``def`` or ``class`` lines, by ``pattern``) of a file's text, found the
    first time they are asked for: the last one above a place is the one the place is in."""

    def __init__(self, raw: bytes, pattern: re.Pattern[bytes]) -> None:
        self._raw, self._pattern = raw, pattern
        self._starts: list[int] = []
        self._names: list[str] | None = None

    def at(self, place: int) -> str | None:
        """The name of the last definition that starts above ``place``; None when none does."""
        if self._names is None:
            found = list(self._pattern.finditer(self._raw))
            self._starts = [match.start() for match in found]
            self._names = [match.group(1).decode("ascii") for match in found]
        above = bisect.bisect_left(self._starts, place)
        return self._names[above - 1] if above else None


def _literal_at(raw: bytes, start: int, names: GateCacheNames) -> bool:
    """Whether the bracketed literal at ``start`` lists a gate-cache name."""
    end = _closing(raw, start)
    if end is None:
        return False
    text = raw[start : end + 1]
    if text.isascii() and not any(
        names.matches(word.decode("ascii")) for word in _QUOTED_WORD.findall(text)
    ):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return any(names.matches(e) for e in _listed(tree.body))


def _closing(raw: bytes, start: int) -> int | None:
    """The offset of the bracket that closes the one at ``start`` (None past a bound)."""
    depth = 0
    for bracket in _BRACKET.finditer(raw, start, min(len(raw), start + _LONGEST_TABLE)):
        if bracket.group() in b"([{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return bracket.start()
    return None


def _listed(value: ast.expr) -> list[str]:
    """The strings a tuple, list or set literal lists, or the keys of a dict literal."""
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        elements: list[ast.expr | None] = list(value.elts)
    elif isinstance(value, ast.Dict):
        elements = list(value.keys)
    else:
        return []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
