"""Gate-cache names learned from the call sites of ReplaySSM decode entry points.

Real code names its gate ring freely (sglang's ``replayssm_g``, a ``decay_ring`` elsewhere) but
always hands it to the decode kernel as the gate-cache argument, directly or through a wrapper
(``layer(x, g_cache=cache.log_alpha)``), a record (``ReplayBuffers(g_cache=ring)``, also by
position: :mod:`.record_positions`) or a mapping
of keyword arguments (``{"g_cache": cache.log_alpha}``). A cheap first pass over every file of a
run finds those calls, keywords and keys and learns the name of whatever is passed — the variable,
an attribute's last part, or a string key — so that the checking pass treats that name as a gate
cache everywhere. Each learned name remembers the place that taught it.

The pass is cheap by design: a file is only parsed (with :mod:`ast`, not libcst) when its text
contains the literal part of an entry-point pattern, and only calls are inspected. Names too
generic to mean "the gate ring" everywhere (``g``, ``gate``, ``x``, ``buf`` ...) are not learned:
the foundation rules say a tensor named ``g`` is not a gate cache, and learning it from one call
would flag every per-token gate in the run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from replaylint.lint.gatecache.calls import (
    LocalValues,
    SpreadLengths,
    argument_for,
    dotted,
    entry_point_of,
    import_aliases,
    passed_name,
    spread_lengths,
)
from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.record_positions import positional_record_names, record_field_pattern
from replaylint.lint.gatecache.ring_order import gate_rings_by_order, may_list_rings
from replaylint.lint.syntax.ast_walk import walk
from replaylint.lint.syntax.limits import too_large

__all__ = [
    "TOO_GENERIC_TO_LEARN",
    "entry_point_needles",
    "learn_gate_cache_names",
    "learn_handed_names",
    "learn_rings_by_order",
    "learnable",
    "learning_needles",
    "parsed",
]

TOO_GENERIC_TO_LEARN: frozenset[str] = frozenset(
    {
        "g", "gate", "gates", "log_g", "g_t", "gt", "x", "y", "t", "a", "b", "tensor", "tensors",
        "buf", "buffer", "buffers", "cache", "caches", "ring", "state", "states", "out", "arg",
        "value", "data", "tmp", "temp", "input", "inputs",
    }
)  # fmt: skip


def learn_gate_cache_names(
    sources: Iterable[tuple[str, str]],
    entry_points: Sequence[EntryPoint],
    known: GateCacheNames | None = None,
) -> dict[str, LearnedFrom]:
    """Names passed as the gate cache of an entry point in ``sources`` ((filename, text) pairs).

    Names that ``known`` already matches are left out (they need no teaching); the first call
    that teaches a name is the one remembered. Files that do not parse are skipped: the checking
    pass reports them.
    """
    patterns = known if known is not None else GateCacheNames()
    needles = entry_point_needles(entry_points)
    passing = _passing_pattern(patterns)
    aliasing = _alias_pattern(patterns)
    recording = record_field_pattern(patterns)
    learned: dict[str, LearnedFrom] = {}
    for filename, text in sources:
        calls = (
            needles is None
            or any(needle in text for needle in needles)
            or _may_teach(passing, text, patterns)
        )
        aliases = aliasing(text)
        records = recording.search(text) is not None
        if not (calls or aliases or records) and not may_list_rings(
            text.encode("utf-8", "surrogatepass")
        ):
            continue  # neither a call that teaches, an alias, a record, nor a row of rings
        if too_large(text) is not None:  # the checking pass reports it
            continue
        try:
            tree = ast.parse(text, filename=filename)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        found = [
            *(_names_in(tree, filename, entry_points, patterns) if calls else ()),
            *(_aliased_names(tree, filename, patterns) if aliases else ()),
            *(positional_record_names(tree, filename, patterns) if records else ()),
            *gate_rings_by_order(tree, filename),
        ]
        for name, origin in found:
            if origin.outranks(learned.get(name)) and learnable(name, patterns):
                learned[name] = origin
    return learned


def learnable(name: str, known: GateCacheNames | None) -> bool:
    """Whether ``name`` may be learned: specific enough to mean the gate ring everywhere, and
    not one ``known`` matches already."""
    if name.lower() in TOO_GENERIC_TO_LEARN or len(name) <= 2:
        return False
    if name.lower().endswith("dtype"):
        return False  # `RingDtypes(logdecay=cfg.torch_dtype)`: a record of dtypes, not rings
    return known is None or not known.matches(name)


def parsed(text: str, filename: str) -> ast.Module | None:
    """``text`` parsed for learning; None when it does not parse (the checking pass reports
    it)."""
    try:
        return ast.parse(text, filename=filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def learn_rings_by_order(
    tree: ast.Module, filename: str, known: GateCacheNames
) -> dict[str, LearnedFrom]:
    """The gate rings ``tree`` names by their place (a file that teaches nothing else)."""
    learned: dict[str, LearnedFrom] = {}
    for name, origin in gate_rings_by_order(tree, filename):
        if learnable(name, known):
            learned.setdefault(name, origin)
    return learned


def learn_handed_names(
    tree: ast.Module, filename: str, known: GateCacheNames
) -> dict[str, LearnedFrom]:
    """What ``tree`` hands over under a name ``known`` matches (a learned one among them):
    ``{"log_forget": self.forget_buf}``, ``Rings(log_forget=buf)``, a record filled by position.
    The round after a name is learned, what it is handed is the gate ring too."""
    found = [
        *positional_record_names(tree, filename, known),
        *_names_in(tree, filename, (), known),  # no entry point: keywords and keys only
    ]
    learned: dict[str, LearnedFrom] = {}
    for name, origin in found:
        if learnable(name, known):
            learned.setdefault(name, origin)
    return learned


def entry_point_needles(entry_points: Sequence[EntryPoint]) -> list[str] | None:
    """Literal text every matching call must contain; None when some pattern has none."""
    needles: list[str] = []
    for entry_point in entry_points:
        pieces = [piece for piece in re.split(r"[*?\[\]]", entry_point.function) if piece]
        if not pieces:
            return None
        needles.append(max(pieces, key=len).rpartition(".")[2] or max(pieces, key=len))
    return needles


def _may_teach(passing: re.Pattern[str], text: str, names: GateCacheNames) -> bool:
    """Whether some keyword or key of ``text`` passes a value that may teach a name: one whose
    written name is not a gate cache already (``g_cache=g_cache`` teaches nothing)."""
    for match in passing.finditer(text):
        value = _WRITTEN_VALUE.match(text, match.end())
        if value is None:
            continue
        last = value.group(1).rpartition(".")[2]
        if not names.matches(last) and last.lower() not in TOO_GENERIC_TO_LEARN:
            return True
    return False


_WRITTEN_VALUE = re.compile(r"\s*([A-Za-z_][\w.]*)")


def _passing_pattern(names: GateCacheNames) -> re.Pattern[str]:
    """Text that passes a value for a gate-cache name: ``g_cache=`` (a keyword) or
    ``"g_cache":`` (a key), for the names' literal pieces; files without it teach nothing but
    through entry-point calls."""
    words = names.literal_alternation()
    return re.compile(rf"[(,]\s*\w*(?:{words})\w*\s*=(?!=)|['\"]\w*(?:{words})\w*['\"]\s*:")


def _alias_pattern(names: GateCacheNames) -> Callable[[str], bool]:
    """Whether text may define an alias of the gate ring: a method (a property) named like a
    gate cache that takes only ``self``, or ``g_cache = property(...)``. The words of the
    patterns are looked for first: most files hold none, and the name patterns are read only
    in those that do."""
    words = [piece.lower() for piece in names.literal_pieces()]
    if not words:
        return lambda text: False
    method = re.compile(r"\bdef\s+(\w+)\s*\(\s*self\s*\)")
    # `= property(` first, then the name before it: a pattern that starts with `\w+` would be
    # tried at every word of the text
    assigned = re.compile(r"=\s*property\s*\(")
    name_before = re.compile(r"\b(\w+)\s*\Z")

    def named(text: str) -> bool:
        lowered = text.lower()
        return any(word in lowered for word in words)

    def may_alias(text: str) -> bool:
        if not named(text):
            return False
        if any(named(match.group(1)) for match in method.finditer(text)):
            return True
        for match in assigned.finditer(text):
            before = name_before.search(text, max(0, match.start() - 256), match.start())
            if before is not None and named(before.group(1)):
                return True
        return False

    return may_alias


def _aliased_names(
    tree: ast.Module, filename: str, patterns: GateCacheNames
) -> Iterator[tuple[str, LearnedFrom]]:
    """``@property def g_cache(self): return self.log_decay_ring`` (or ``g_cache =
    property(lambda self: self.log_decay_ring)``): an accessor named for the gate ring that
    hands out an attribute as it is makes that attribute the gate ring under its own name."""
    for cls in walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for statement in cls.body:
            returned: ast.expr | None = None
            if isinstance(statement, ast.FunctionDef) and patterns.matches(statement.name):
                args = statement.args
                plain = len(args.args) == 1 and not (
                    args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs
                )
                body = [s for s in statement.body if not _docstring(s)]
                if plain and len(body) == 1 and isinstance(body[0], ast.Return):
                    returned = body[0].value
                name = statement.name
            elif (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and patterns.matches(statement.targets[0].id)
                and isinstance(statement.value, ast.Call)
                and dotted(statement.value.func) == "property"
                and statement.value.args
                and isinstance(statement.value.args[0], ast.Lambda)
            ):
                returned = statement.value.args[0].body
                name = statement.targets[0].id
            if not (
                isinstance(returned, ast.Attribute)
                and isinstance(returned.value, ast.Name)
                and returned.value.id == "self"
            ):
                continue
            reason = (
                f"returned by `{cls.name}.{name}`, named for the gate cache, at "
                f"{filename}:{statement.lineno}"
            )
            yield returned.attr, LearnedFrom(filename, statement.lineno, name, reason)


def _docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def learning_needles(entry_points: Sequence[EntryPoint], names: GateCacheNames) -> list[str] | None:
    """Literal text a file that teaches a name must contain: an entry point's, or a gate-cache
    pattern's longest literal piece (``*_g_cache`` -> ``_g_cache``); None when some entry-point
    pattern has none."""
    needles = entry_point_needles(entry_points)
    if needles is None:
        return None
    return needles + names.literal_pieces()


def _names_in(
    tree: ast.AST, filename: str, entry_points: Sequence[EntryPoint], patterns: GateCacheNames
) -> Iterator[tuple[str, LearnedFrom]]:
    aliases = import_aliases(tree)
    lengths: list[SpreadLengths] = []
    locals_: list[LocalValues] = []

    def spread(expr: ast.expr) -> int | None:
        if not lengths:  # a walk of the module, only for a call that spreads a sequence
            lengths.append(spread_lengths(tree))
        return lengths[0](expr)

    for node in walk(tree):
        if isinstance(node, ast.Dict):
            yield from _mapping_names(node, filename, patterns)
            continue
        if not isinstance(node, ast.Call):
            continue
        written = dotted(node.func)
        entry = entry_point_of(written, aliases, entry_points)
        if entry is None:
            yield from _keyword_names(node, written, filename, patterns)
            continue
        assert written is not None
        argument = argument_for(node, entry.parameter, entry.index, spread)
        name = None if argument is None else passed_name(argument)
        # a tensor the call also passes as another argument (one scratch ring for the d, k
        # and g rings) is no gate cache by name: a fix of it would change the others too
        others = [*node.args, *(keyword.value for keyword in node.keywords)]
        if name is None or any(
            other is not argument and passed_name(other) == name for other in others
        ):
            continue
        origin = LearnedFrom(filename, node.lineno, written)
        if not isinstance(argument, ast.Name):
            yield name, origin
            continue
        # a local: also the attribute or key it was taken from, unless another argument was
        # taken from the same one
        if not locals_:
            locals_.append(LocalValues(tree))
        sources = _sources(locals_[0], node, argument)
        passed = {passed_name(other) for other in others if other is not argument}
        for other in others:
            if other is not argument and isinstance(other, ast.Name):
                passed |= _sources(locals_[0], node, other)
        if sources & passed:
            continue
        yield name, origin
        for source in sorted(sources - {name}):
            yield source, origin


def _sources(local_values: LocalValues, call: ast.Call, local: ast.Name) -> set[str]:
    """The attributes and keys the local ``local`` that ``call`` passes was taken from."""
    found = (_attribute_or_key(value) for value in local_values.values(call, local.id))
    return {source for source in found if source is not None}


def _attribute_or_key(value: ast.expr) -> str | None:
    """``self.forget_cache`` / ``rings["la"]`` (``.contiguous()`` and the like allowed): the name
    a local was taken by; not an element by position (``rings[2]`` names the whole list)."""
    inner = value
    while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
        inner = inner.func.value
    if isinstance(inner, ast.Subscript) and not (
        isinstance(inner.slice, ast.Constant) and isinstance(inner.slice.value, str)
    ):
        return None
    return passed_name(value) if isinstance(inner, (ast.Attribute, ast.Subscript)) else None


def _keyword_names(
    call: ast.Call, written: str | None, filename: str, patterns: GateCacheNames
) -> Iterator[tuple[str, LearnedFrom]]:
    """``layer(x, g_cache=cache.log_alpha)``, ``ReplayBuffers(g_cache=ring)``: whatever a call
    passes for a parameter named like a gate cache is the gate ring (a wrapper of the decode
    entry point, a record of the rings), unless the call passes it for another parameter too."""
    callee = written or "a call"
    for keyword in call.keywords:
        if keyword.arg is None or not patterns.matches(keyword.arg):
            continue
        name = passed_name(keyword.value)
        others = [*call.args, *(k.value for k in call.keywords if k is not keyword)]
        if name is not None and not any(passed_name(other) == name for other in others):
            yield name, LearnedFrom(filename, call.lineno, f"{callee}({keyword.arg}=...)")


def _mapping_names(
    mapping: ast.Dict, filename: str, patterns: GateCacheNames
) -> Iterator[tuple[str, LearnedFrom]]:
    """``{"g_cache": cache.log_alpha, ...}`` (the keyword arguments of a decode call, a graph's
    static inputs): the value stored under a gate-cache key is the gate ring."""
    for key, value in zip(mapping.keys, mapping.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if not patterns.matches(key.value):
            continue
        name = passed_name(value)
        others = [v for k, v in zip(mapping.keys, mapping.values, strict=True) if k is not key]
        if name is not None and not any(passed_name(other) == name for other in others):
            yield name, LearnedFrom(filename, key.lineno, f'{{"{key.value}": ...}}')
