"""Which project classes hold a gate buffer that a module cast converts, from their summaries.

A class's summary (:mod:`replaylint.lint.project.module_facts`) lists the buffers its methods
register, its base classes and the classes it builds into its attributes. A cast of an instance
converts a floating gate buffer that the class, a base class or a part (at any depth, in any
module of the project) registers, unless a class on the way decides itself what casts do
(guarded, or overriding a cast method), which stops the search.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from replaylint.lint.project.index import Found, Origin, ProjectIndex
from replaylint.lint.project.summaries import Value

_MAX_DEPTH = 6
MALFORMED = (IndexError, KeyError, TypeError, ValueError, AttributeError)
# `register_buffer("<name>"` or `register_buffer(f"..."`, and `self.<name> = nn.Buffer(`
_REGISTERED = re.compile(
    r"register_buffer\s*\(\s*[fFrR]?(['\"])(?P<registered>.*?)\1"
    r"|\.(?P<assigned>\w+)\s*(?::[^=\n]*)?=\s*(?:[\w.]+\.)?Buffer\s*\("
)
_NAMED_BY_A_VARIABLE = re.compile(r"register_buffer\s*\(\s*[A-Za-z_]")
_QUOTED_WORD = re.compile(r"""['"]([A-Za-z_][A-Za-z0-9_]*)['"]""")
MODULE_CAST_CALL = re.compile(r"\.(?:half|bfloat16|to|type)\s*\(")
"""Text that may be a module cast: a file without it casts no model."""
GENERIC_MODULE = re.compile(
    r":\s*['\"]?(?:torch\.)?(?:nn\.)?Module\b"
    r"|\b(?:self|model|module|net|network)\.(?:half|bfloat16|to|type)\s*\("
    r"|\bnn\.(?:ModuleDict|ModuleList|Sequential)\s*\("
    r"|\._buffers\b|\.named_buffers\s*\("
)
"""Text that may name a module of no known class: an ``nn.Module`` annotation, a cast of
``self`` or of a receiver named like a model, a container of modules, or a walk over any module's
buffers (``module._buffers``, ``named_buffers()``) (a file that also has a
:data:`MODULE_CAST_CALL` may cast one)."""

Flags = Mapping[str, Mapping[str, object]]
"""Per method called on an instance, the literal keyword arguments of the call."""
Matches = Callable[[str], bool]
"""Whether a name is a gate cache's."""


@dataclass(frozen=True)
class ImportedGateBuffer:
    """A gate buffer that a cast of an instance of ``cls`` converts."""

    cls: str
    """The class of the instance cast."""
    name: str
    """The buffer's name as registered (an f-string as written)."""
    owner: str
    """The class that registers it."""
    origin: Origin
    """Where it is registered."""
    held_by: tuple[str, ...] = ()
    """The attributes that hold the registering class's instance, outermost first."""


def registers_gate_buffer(text: str, matches: Matches) -> bool:
    """Whether ``text`` registers a buffer under a gate-cache name (an f-string name as if its
    fields were numbers): the cheap question before any class is walked or summarised."""
    if "register_buffer" not in text and "Buffer" not in text:
        return False  # the search below tries every `.` of the text
    # a field may also be the ring's own name (`f"static_{name}"` over the ring names)
    if any(
        matches(re.sub(r"\{[^}]*\}", field, found.group("registered") or found.group("assigned")))
        for found in _REGISTERED.finditer(text)
        for field in ("0", "g_cache")
    ):
        return True
    # `register_buffer(name, ...)` in a loop over names the text lists, or a record's fields
    return _NAMED_BY_A_VARIABLE.search(text) is not None and (
        "._fields" in text
        or "._asdict(" in text
        or any(matches(word) for word in _QUOTED_WORD.findall(text))
    )


def class_gate_buffer(
    index: ProjectIndex,
    matches: Matches,
    found: Found,
    called: frozenset[str] | None = None,
    *,
    fresh: bool = False,
    reinstalled: frozenset[str] = frozenset(),
    flags: Flags | None = None,
) -> ImportedGateBuffer | None:
    """The gate buffer (one of ``names``) that a cast of an instance of the project class
    ``found`` converts; None when there is none or a class on the way keeps it float32.
    ``called``: the methods called on the instance before the cast, for the parts a method
    installs (``model.setup_caches(...)``); None counts every such part. ``fresh``: the instance
    was just constructed, so only buffers its constructors register count. ``reinstalled``: the
    methods surely called on it after the cast: the parts they install are made again, and what
    the cast did to the old ones does not last. ``flags``: per method called, the literal
    keyword arguments it was called with (``graph=True``), which pick among a method's choice of
    part classes."""
    try:
        return _gate_buffer(
            index, matches, found, 0, set(), called, fresh, reinstalled, flags or {}
        )
    except MALFORMED:
        return None


def registered_gate_buffer(
    index: ProjectIndex, matches: Matches, found: Found
) -> ImportedGateBuffer | None:
    """The floating gate buffer the project class ``found`` or a base class registers, whatever
    its cast methods do (a state-dict load with ``assign=True`` replaces the buffer itself)."""
    seen: set[tuple[str, str]] = set()
    pending = [found]
    try:
        while pending and len(seen) <= _MAX_DEPTH:
            cls = pending.pop(0)
            if (cls.module, cls.name) in seen:
                continue
            seen.add((cls.module, cls.name))
            facts = _facts(cls)
            if facts is None:
                continue
            if facts.get("guarded"):
                return None  # the guard keeps a loaded gate entry float32 too
            for name, line, _ in facts["buffers"]:
                if matches(re.sub(r"\{[^}]*\}", "0", str(name))):
                    origin = Origin(name, index.path_of(cls.module), line)
                    return ImportedGateBuffer(found.name, str(name), cls.name, origin)
            pending += [b for b in (class_value(index, cls.module, v) for v in facts["bases"]) if b]
    except MALFORMED:
        return None
    return None


def imports_gate_buffer_class(index: ProjectIndex, matches: Matches, module: str) -> bool:
    """Whether ``module`` imports (``from x import Y``) a project class that holds a gate buffer:
    the pre-filter's question for a file that mentions no gate cache but may cast a model."""
    known = index.holder_names
    if known is not None and not known:
        return False
    summary = index.summary(module)
    for spec, name in summary["imports"] if summary is not None else ():
        if name is None or (known is not None and name not in known):
            continue
        target = index.value_target(module, ["ref", spec, name], (), 0)
        if (
            isinstance(target, Found)
            and target.definition[0] == "class"
            and class_gate_buffer(index, matches, target) is not None
        ):
            return True
    return False


def project_bases(index: ProjectIndex, found: Found) -> set[str]:
    """The names of the project classes ``found`` derives from, at any depth."""
    return {current.name for current in islice(with_bases(index, found), 1, None)}


def class_keeps_float32(index: ProjectIndex, found: Found, matches: Matches) -> bool:
    """Whether the project class ``found`` or one of its project bases keeps gate buffers
    float32 through a module cast."""
    return any(
        (facts := _facts(current)) is not None and _keeps(facts, matches)
        for current in with_bases(index, found)
    )


def with_bases(index: ProjectIndex, found: Found) -> Iterator[Found]:
    """``found``, then the project classes it derives from, at any depth, each once."""
    stack, seen = [found], {(found.module, found.name)}
    while stack:
        current = stack.pop()
        yield current
        facts = _facts(current)
        for base in facts["bases"] if facts is not None else ():
            parent = class_value(index, current.module, base)
            if parent is not None and (parent.module, parent.name) not in seen:
                seen.add((parent.module, parent.name))
                stack.append(parent)


def class_value(index: ProjectIndex, module: str, value: Value) -> Found | None:
    """The project class a summary value of ``module`` names."""
    target = index.value_target(module, value, (), 0)
    return target if isinstance(target, Found) and target.definition[0] == "class" else None


def _facts(found: Found) -> dict[str, Any] | None:
    facts = found.definition[3].get("module")
    return facts if isinstance(facts, dict) else None


def _keeps(facts: dict[str, Any], matches: Matches) -> bool:
    return bool(facts["keeps"]) or any(matches(str(name)) for name in facts["restores"])


def _gate_buffer(
    index: ProjectIndex,
    matches: Matches,
    found: Found,
    depth: int,
    seen: set[tuple[str, str]],
    called: frozenset[str] | None,
    fresh: bool = False,
    reinstalled: frozenset[str] = frozenset(),
    flags: Flags | None = None,
) -> ImportedGateBuffer | None:
    key = (found.module, found.name)
    facts = _facts(found)
    if depth > _MAX_DEPTH or key in seen or facts is None or _keeps(facts, matches):
        return None
    seen.add(key)
    path = index.path_of(found.module)
    for name, line, maker in facts["buffers"]:
        if fresh and maker:
            continue  # made by a method that has not run on a new instance
        if matches(re.sub(r"\{[^}]*\}", "0", str(name))):
            return ImportedGateBuffer(found.name, str(name), found.name, Origin(name, path, line))
    for base in facts["bases"]:
        parent = class_value(index, found.module, base)
        if parent is None:
            continue
        parent_facts = _facts(parent)
        if parent_facts is not None and _keeps(parent_facts, matches):
            return None  # a guarded base keeps what it and its subclasses hold float32
        inherited = _gate_buffer(
            index, matches, parent, depth + 1, seen, called, fresh, reinstalled, flags
        )
        if inherited is not None:
            return ImportedGateBuffer(
                found.name, inherited.name, inherited.owner, inherited.origin, inherited.held_by
            )
    installs = facts.get("installs", ())
    installed = [
        (attribute, callees, method)
        for attribute, callees, method in installs
        if called is None or method in called
    ]
    made_again = {attribute for attribute, _, method in installs if method in reinstalled}
    # a part's own installers are not known to have run: only its constructed parts count
    inner: frozenset[str] | None = None if called is None else frozenset()
    parts = [(attribute, callees, "") for attribute, callees in facts["holds"]]
    for attribute, callees, method in [*parts, *installed]:
        if attribute in made_again:
            continue
        passed = (flags or {}).get(method, {}) if method else {}
        for callee in callees:
            held = _held_part(
                index, matches, found.module, callee, depth, seen, inner, fresh, passed
            )
            if held is not None:
                return ImportedGateBuffer(
                    found.name,
                    held.name,
                    held.owner,
                    held.origin,
                    (f"{found.name}.{attribute}", *held.held_by),
                )
    return None


def _held_part(
    index: ProjectIndex,
    matches: Matches,
    module: str,
    callee: Value,
    depth: int,
    seen: set[tuple[str, str]],
    called: frozenset[str] | None,
    fresh: bool = False,
    passed: Mapping[str, object] | None = None,
) -> ImportedGateBuffer | None:
    """The gate buffer a part that ``callee`` builds holds. For a choice of classes
    (``["either", [class, ...]]`` of ``cache_cls = A if static else B``), the first one a
    choice holds: a cast converts it whenever that class is the one chosen, even if another
    choice keeps its gate buffer float32. Each choice is searched on its own. A choice made by
    a parameter of the installing method (``["flag", parameter, value]``) that the call
    ``passed`` a literal for is the one class it picks."""
    if callee[0] == "either":
        choices = callee[1]
        flag = callee[3] if len(callee) > 3 else None
        if flag is not None and len(choices) == 2 and str(flag[1]) in (passed or {}):
            given = (passed or {})[str(flag[1])]
            taken = bool(given) if flag[2] is True else given == flag[2]
            choices = [choices[0] if taken else choices[1]]
        for choice in choices:
            held = _held_part(index, matches, module, choice, depth, set(seen), called, fresh)
            if held is not None:
                return held
        return None
    part = class_value(index, module, callee)
    if part is None:
        return None
    return _gate_buffer(index, matches, part, depth + 1, seen, called, fresh)
