"""The textual pre-filter: a file whose text names no gate cache and no decode entry point cannot
hold a finding, so it is never parsed.

Every rule reports on a gate cache or an entry-point call, and both are recognised by name — also
when the name is built from pieces (``f"{kind}_cache"`` over ``("d", "k", "g")``), so a string
piece that ends like a gate-cache name (``}_cache"``, ``"_cache"``) counts too. This loses nothing: ``tests/lint/test_prefilter.py`` lints every corpus with the pre-filter on and
off and requires identical findings. A case-insensitive substring search for the literal core of
each name pattern (``g_cache``, ``gate_cache``, ``replayssm_g``, ``replayssm_decode``, learned
names, ...) rejects almost every file of a large tree in microseconds; the few survivors are
confirmed word by word with the same matcher the rules use.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.gatecache.grep import contains_needle
from replaylint.lint.gatecache.names import (
    GATE_DTYPE_WORDS,
    GATE_FIELD_WORDS,
    RING_SUFFIXES,
    TABLE_GATE_WORDS,
    GateCacheNames,
)

_GLOB_META = re.compile(r"[*?\[\]]")
_WORD_FROM = re.compile(r"\w*")
# The identifier characters right before a position: searched for between 0 and that position.
_WORD_BEFORE = re.compile(r"\w+\Z")
_LONGEST_WORD = 256  # how far left of a core to look for the start of its identifier
_QUOTED = ('"', "'", 's"', "s'")
# A record of the rings' dtypes declares the gate ring's field by its word alone
# (:mod:`replaylint.lint.dataflow.dtype_records`); other names of it contain a core already.
_RECORD_FIELD_NEEDLES = tuple(
    f"{word}: {annotation}"
    for word in sorted(GATE_FIELD_WORDS)
    for annotation in ("torch.dtype", "Optional[torch.dtype]")
)
# Searched from the annotation (a literal `:` first), the line's start checked after: many
# times faster than a pattern anchored at every line's start.
_DTYPE_ANNOTATION = re.compile(r":[ \t]*(?:Optional\[[ \t]*)?torch\.dtype\b", re.IGNORECASE)
_FIELD_NAME = re.compile(rf"[ \t]+(?:{'|'.join(sorted(GATE_FIELD_WORDS))})[ \t]*", re.IGNORECASE)
# the gate entry of a table of ring dtypes keyed by the rings' words (`"log_decay": "float16"`;
# `"gate"`, `"g"` and `"alpha"` count only after a d ring's entry, `"delta": ...`), its value a
# dtype's name or a torch dtype
_TABLE_WORDS = sorted(TABLE_GATE_WORDS | {"delta"})
_TABLE_KEY_NEEDLES = tuple(f"{q}{word}{q}:" for word in _TABLE_WORDS for q in ('"', "'"))
_DTYPE_VALUE = r"""[ \t]*:[ \t]*(?:["'][\w.]+["']|torch\.\w+)"""
_TABLE_KEY = re.compile(
    rf"""["'](?:{"|".join(sorted(TABLE_GATE_WORDS))})["']{_DTYPE_VALUE}"""
    rf"""|["']delta["'][ \t]*:[^}}]{{0,300}}["'](?:gate|g|alpha)["']{_DTYPE_VALUE}""",
    re.IGNORECASE,
)


def _ring_stems(learned: Iterable[str]) -> set[str]:
    """``forget`` of a learned ``forget_ring``: what its dtype setting is named after."""
    stems = set()
    for name in learned:
        lowered = name.lower()
        for suffix in RING_SUFFIXES:
            if lowered.endswith(f"_{suffix}") and len(lowered) > len(suffix) + 3:
                stems.add(lowered[: -len(suffix) - 1])
    return stems


def _declares_gate_dtype_field(text: str) -> bool:
    """Whether a line of ``text`` is an indented ``gate: torch.dtype`` (a record's field)."""
    for annotation in _DTYPE_ANNOTATION.finditer(text):
        line = text.rfind("\n", 0, annotation.start()) + 1
        if _FIELD_NAME.fullmatch(text, line, annotation.start()):
            return True
    return False


def _literal_core(pattern: str) -> str:
    """The longest piece of a glob without wildcards, lower-cased ("" when it has none)."""
    pieces = [piece for piece in _GLOB_META.split(pattern.lower()) if piece]
    return max(pieces, key=len) if pieces else ""


class Relevance:
    """Decides from text alone whether a file may hold a finding."""

    def __init__(self, gate_caches: GateCacheNames, entry_points: Sequence[EntryPoint]) -> None:
        self.gate_caches = gate_caches
        self._entry_globs = tuple(ep.function.rpartition(".")[2] for ep in entry_points)
        needles = [_literal_core(pattern.lstrip("_")) for pattern in gate_caches.patterns]
        needles += [_literal_core(glob) for glob in self._entry_globs]
        needles += [name.lower() for name in gate_caches.learned]
        # Name endings (``_cache`` of ``g_cache``) that an f-string or a concatenation may complete
        # (``f"{kind}_cache"``, ``kind + "_cache"``): a string piece that starts with one counts.
        gate_cores = [c for c in needles[: len(gate_caches.patterns)] if c]
        endings = {core[core.index("_", 1) :] for core in gate_cores if "_" in core[1:]}
        endings = {e for e in endings if not any(o != e and e.endswith(o) for o in endings)}
        # settings of the gate cache's dtype (`gate_dtype: torch.dtype = torch.bfloat16`)
        needles += [f"{word}_dtype" for word in GATE_DTYPE_WORDS]
        # and of a learned ring's (`forget_dtype` beside a learned `forget_ring`)
        needles += [f"{stem}_dtype" for stem in _ring_stems(gate_caches.learned)]
        # Words that contain a core are the only ones worth matching exactly.
        self._cores = tuple(sorted({n for n in needles if n}))
        # the gate ring's field of a record of ring dtypes (`gate: torch.dtype`)
        needles += list(_RECORD_FIELD_NEEDLES)
        needles += list(_TABLE_KEY_NEEDLES)
        for ending in endings:  # an ending alone would match everywhere (kv_cache): add it quoted
            needles += [ending + tail for tail in _QUOTED]
        self._built_name = re.compile(
            "|".join(rf"""[}}"']{re.escape(e)}s?["']""" for e in sorted(endings)) or "(?!)",
            re.IGNORECASE,
        )
        # Stage one is a superset test: a needle that contains another one adds nothing. A pattern
        # without a literal part ("*") may match any word: then nothing is skipped early.
        unique = set(needles)
        self._needles: tuple[str, ...] | None = (
            None
            if "" in unique
            else tuple(sorted(n for n in unique if not any(o != n and o in n for o in unique)))
        )
        self._byte_needles = (
            None
            if self._needles is None or not all(n.isascii() for n in self._needles)
            else tuple(n.encode() for n in self._needles)
        )

    @property
    def byte_needles(self) -> tuple[bytes, ...] | None:
        """Stage one's needles (lower-case ASCII); None when stage one cannot rule anything out."""
        return self._byte_needles

    def may_hold_finding_raw(self, raw: bytes) -> bool:
        """Stage one on undecoded bytes: False means the file surely holds no finding."""
        if self._byte_needles is None:
            return True
        return contains_needle(raw, self._byte_needles)

    def _words_with_cores(self, text: str, lowered: str) -> set[str]:
        """Every identifier of ``text`` that contains a core, found from the core outwards."""
        words: set[str] = set()
        for core in self._cores:
            start = lowered.find(core)
            while start != -1:
                left = _WORD_BEFORE.search(text, max(0, start - _LONGEST_WORD), start)
                right = _WORD_FROM.match(text, start)
                assert right is not None
                words.add(text[left.start() if left else start : right.end()])
                start = lowered.find(core, max(right.end(), start + 1))
        return words

    def is_relevant_word(self, word: str) -> bool:
        return (
            self.gate_caches.matches(word)
            or self.gate_caches.names_gate_dtype(word)
            or any(fnmatch.fnmatchcase(word, glob) for glob in self._entry_globs)
        )

    def may_hold_finding(self, text: str) -> bool:
        lowered = text.lower()
        if len(lowered) != len(text):  # "İ" lowers to two characters: keep offsets aligned
            lowered = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
        if self._needles is not None and not any(needle in lowered for needle in self._needles):
            return False
        # `f"state_g_cache_{layer}"` names `state_g_cache_0` where the field is a number
        if any(
            self.is_relevant_word(word)
            or (word.endswith("_") and self.is_relevant_word(word + "0"))
            for word in self._words_with_cores(text, lowered)
        ):
            return True
        return (
            self._built_name.search(text) is not None
            or _declares_gate_dtype_field(text)
            or _TABLE_KEY.search(text) is not None
        )
