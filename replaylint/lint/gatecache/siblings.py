"""Gate-cache names that follow from the names of the other rings: ``alpha_rows`` beside
``delta_rows`` and ``key_rows`` when ``alpha_buffer`` is the gate ring beside ``delta_buffer`` and
``key_buffer``.

Code names its three rings in parallel: a pool holds ``delta_buffer``, ``key_buffer`` and
``alpha_buffer``, a gather returns ``delta``, ``key`` and ``alpha``, a graph keeps
``delta_rows``, ``key_rows`` and ``alpha_rows``. Once one name of such a family is a gate cache (by
pattern or learned), its *stem* (``alpha``) identifies the gate ring in the file's other
families: a name made of the stem and an affix (``alpha_rows``, ``alpha``, ``spec_alpha``) is a
gate cache in that file when two other stems of the first family (``delta``, ``key``) form names
with the same affix there too. Affixes that name a tensor's metadata (``_shape``, ``_dtype``,
``_idx`` ...) form no ring names, and names too generic to mean the gate ring are never derived.
The derivation is per file: the evidence is the file's own identifiers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom

_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_METADATA = frozenset(
    {"shape", "shapes", "dtype", "dtypes", "size", "sizes", "bytes", "numel", "stride", "strides"}
    | {"idx", "index", "indices", "offset", "offsets", "len", "dim", "dims", "spec", "specs"}
    | {"name", "names", "tag", "id", "ids", "slice", "start", "end", "count"}
)
_GENERIC = frozenset({"g", "gate", "gates", "x", "a", "b", "t", "out", "value", "data", "tmp"})
_MIN_FAMILY = 2  # the d and k rings: two other members make a family


def sibling_names(names: GateCacheNames, text: str, filename: str) -> dict[str, LearnedFrom]:
    """Names of the file ``text`` that are gate caches because of their siblings (see the module
    docstring), each with why."""
    identifiers = set(_IDENTIFIER.findall(text))
    gates = sorted(name for name in identifiers if names.matches(name))
    derived: dict[str, LearnedFrom] = {}
    for gate in gates:
        for stem, affix, before in _splits(gate):
            family = _family(identifiers, stem, affix, before)
            if len(family) < _MIN_FAMILY:
                continue
            for name, others in _relatives(identifiers, stem, family, before):
                if name in derived or names.matches(name) or name.lower() in _GENERIC:
                    continue
                if len(name) <= 2:
                    continue
                reason = f"named like the gate ring `{gate}` beside `{others[0]}` and `{others[1]}`"
                derived[name] = LearnedFrom(filename, _first_row(text, name), "", reason)
    return derived


def _splits(gate: str) -> Iterator[tuple[str, str, bool]]:
    """(stem, affix, affix-before-stem) for every split of ``gate`` at an underscore:
    ``alpha_buffer`` -> (``alpha``, ``_buffer``, False) and (``buffer``, ``alpha_``, True)."""
    parts = gate.split("_")
    for cut in range(1, len(parts)):
        head, tail = "_".join(parts[:cut]), "_".join(parts[cut:])
        if head and tail:
            yield head, f"_{tail}", False
            yield tail, f"{head}_", True


def _family(identifiers: set[str], stem: str, affix: str, before: bool) -> list[str]:
    """The other stems that form a name with ``affix``: ``delta``, ``key`` for ``_buffer``."""
    found = []
    for name in identifiers:
        if before and name.startswith(affix) and len(name) > len(affix):
            other = name[len(affix) :]
        elif not before and name.endswith(affix) and len(name) > len(affix):
            other = name[: -len(affix)]
        else:
            continue
        if other != stem and "_" not in other.strip("_") and other.lower() not in _METADATA:
            found.append(other)
    return sorted(found)


def _relatives(
    identifiers: set[str], stem: str, family: list[str], before: bool
) -> Iterator[tuple[str, list[str]]]:
    """Names of ``stem`` with an affix that two family members share: (name, those names)."""
    for name in sorted(identifiers):
        if not before and name.startswith(stem):
            affix = name[len(stem) :]
            if affix and not affix.startswith("_"):
                continue
            others = [f"{other}{affix}" for other in family if f"{other}{affix}" in identifiers]
        elif before and name.endswith(stem):
            affix = name[: -len(stem)]
            if affix and not affix.endswith("_"):
                continue
            others = [f"{affix}{other}" for other in family if f"{affix}{other}" in identifiers]
        else:
            continue
        words = affix.strip("_").split("_") if affix else []
        if any(word.lower() in _METADATA for word in words):
            continue
        if len(others) >= _MIN_FAMILY:
            yield name, others


def _first_row(text: str, name: str) -> int:
    match = re.search(rf"\b{re.escape(name)}\b", text)
    return text.count("\n", 0, match.start()) + 1 if match else 1
