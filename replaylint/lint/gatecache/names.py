"""Which names denote a ReplaySSM gate cache.

A gate cache is recognised by name: a variable (``g_cache``), the last part of an attribute
(``self.g_cache``, ``layer_cache.replayssm_g``), a string key (``caches["g_cache"]``) or a keyword
(``g_cache=...``). Patterns are shell-style globs matched case-insensitively against the name with
leading underscores stripped; each pattern also matches its plural (``g_caches``). Names taught by
call sites of decode entry points ("learned" names) are added per run, with the call that taught
them, so that a finding can say why a name counts; a learned name also matches its qualified
variants (``pad_decay_ring`` once ``decay_ring`` is learned), its plural and its name with a ring
word after it (``decay_rings``, ``alpha_log_ring`` once ``decay_ring`` and ``alpha_log`` are), and
its variants with a word inside (``alpha_move_buffer`` once ``alpha_buffer`` is), in any case
(``STATE_DECAY_LOG`` once ``decay_log`` is). Every name also matches with a layer index after it
(``g_cache_3``, ``STATE_DECAY_LOG_0``) and as the last part of a dotted key
(``"layers.0.g_cache"``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_GATE_CACHE_PATTERNS: tuple[str, ...] = (
    "g_cache",
    "gate_cache",
    "gate_ring",
    "replayssm_g",
    "*_g_cache",
    "*_gate_cache",
    "*_gate_ring",
    "*_replayssm_g",
)


# a ring word after a learned name names the same ring (`alpha_log` -> `alpha_log_ring`)
_RING_WORDS = r"_(?:ring|cache|buffer|buf)s?"

# words that name the gate ring in a dtype setting (`gate_dtype`, `g_dtype`, `gate_ring_dtype`)
GATE_DTYPE_WORDS = frozenset({"gate", "g", "gate_ring", "g_ring", "log_decay", "decay"})
# the gate ring's field of a record of the rings' dtypes, by its word alone (`gate: torch.dtype`
# beside `delta` and `key`): what the pre-filter looks for and the analysis reads
GATE_FIELD_WORDS = frozenset(
    {"gate", "g", "log_decay", "logdecay", "decay", "alpha", "log_alpha", "forget", "log_forget"}
)
# keys of a table of ring dtypes that name the gate ring's entry: on their own, and only beside
# the d and k rings' entries (a router's `gate` beside `experts` is no ring's)
TABLE_GATE_WORDS = frozenset(
    {"log_decay", "logdecay", "decay", "forget", "log_forget", "log_alpha"}
)
TABLE_SHARED_WORDS = frozenset({"gate", "g", "alpha"})
_GATE_RING_WORDS = frozenset({"gate_ring", "g_ring", "log_decay"})
# what a ring's name adds to what it holds (`logdecay_ring` holds log-decays, and its dtype
# setting is `logdecay_dtype`)
RING_SUFFIXES = ("ring", "cache", "buf", "buffer", "ring_buf", "history")


# how the reasons of names guessed from their neighbours begin
NAMED_LIKE = "named like the gate ring"
WRITTEN_AFTER = "written after"


@dataclass(frozen=True)
class LearnedFrom:
    """The entry-point call that made a name a gate-cache name (or, with ``reason``, what else
    did)."""

    filename: str
    row: int
    function: str
    reason: str = ""

    @property
    def guessed(self) -> bool:
        """Whether the name was taken from its neighbours (the names beside it, its place after
        the d and k rings) rather than from a call that passes it as the gate cache."""
        return self.reason.startswith((NAMED_LIKE, WRITTEN_AFTER))

    def outranks(self, earlier: LearnedFrom | None) -> bool:
        """Whether this origin replaces ``earlier``: none yet, or a guess from the name's place
        that a call passing it as the gate cache outranks."""
        return earlier is None or (earlier.guessed and not self.guessed)

    def describe(self) -> str:
        if self.reason:
            return self.reason
        return f"passed as the gate cache of `{self.function}` at {self.filename}:{self.row}"


class GateCacheNames:
    """Decides whether a name denotes a gate cache; immutable once built."""

    def __init__(
        self,
        patterns: Iterable[str] = DEFAULT_GATE_CACHE_PATTERNS,
        learned: Mapping[str, LearnedFrom] | None = None,
    ) -> None:
        self.patterns: tuple[str, ...] = tuple(patterns)
        # fnmatch.translate yields "(?s:...)\Z"; the plural allows an "s" before the end.
        cores = [fnmatch.translate(p.lower().lstrip("_"))[: -len(r"\Z")] for p in self.patterns]
        self._regex = re.compile("|".join(f"(?:{core}s?)" for core in cores) or "(?!)")
        self._singular = re.compile("|".join(f"(?:{core})" for core in cores) or "(?!)")
        self.learned: dict[str, LearnedFrom] = dict(learned or {})
        # learned names match in any case, as patterns do (`STATE_DECAY_LOG` once `decay_log`
        # is learned): by lower-case name, the name as learned
        self._learned_lower = {name.lower(): name for name in sorted(self.learned, reverse=True)}
        # a learned name also names its qualified variants, as `*_g_cache` does `g_cache`'s:
        # `pad_decay_ring` when `decay_ring` was learned; not a one-word name guessed from its
        # place (`decay` beside `d` and `k` does not make `weight_decay` a ring)
        suffixes = "|".join(re.escape(name) for name in sorted(self.learned))
        qualifiable = "|".join(
            re.escape(name)
            for name in sorted(self.learned)
            if "_" in name.strip("_") or not self.learned[name].guessed
        )
        self._qualified = re.compile(
            f"[A-Za-z0-9_]*_({qualifiable})s?" if qualifiable else "(?!)", re.IGNORECASE
        )
        # ... its plural and its name with a ring word after it, as a pattern's plural is:
        # `log_alpha_rings` when `log_alpha_ring` was, `alpha_log_ring` when `alpha_log` was
        self._extended = re.compile(
            f"({suffixes})(?:s|{_RING_WORDS})" if suffixes else "(?!)", re.IGNORECASE
        )
        # ... and its variants with a word inside: `alpha_move_buffer` when `alpha_buffer` was
        self._infixed = [
            (
                re.compile(
                    f"{re.escape(head)}_[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*_{re.escape(tail)}s?",
                    re.IGNORECASE,
                ),
                name,
            )
            for name in sorted(self.learned)
            if not self.learned[name].reason
            for head, _, tail in [name.partition("_")]
            if head and tail
        ]

    def with_learned(self, learned: Mapping[str, LearnedFrom]) -> GateCacheNames:
        merged = dict(self.learned)
        for name, origin in learned.items():
            merged.setdefault(name, origin)
        return GateCacheNames(self.patterns, merged)

    def matches(self, name: str) -> bool:
        core = _core(name)
        return self._matches(name) or (core != name and self._matches(core))

    def _matches(self, name: str) -> bool:
        return (
            self._regex.fullmatch(name.lower().lstrip("_")) is not None
            or name.lower() in self._learned_lower
            or self._qualified.fullmatch(name) is not None
            or self._extended.fullmatch(name) is not None
            or any(infixed.fullmatch(name) for infixed, _ in self._infixed)
        )

    def literal_pieces(self) -> list[str]:
        """Each pattern's longest literal piece (``*_g_cache`` -> ``_g_cache``), when it is long
        enough to search text for: what every name a pattern matches contains."""
        pieces = [max(re.split(r"[*?\[\]]", pattern), key=len) for pattern in self.patterns]
        return [piece for piece in pieces if len(piece) > 2]

    def literal_alternation(self) -> str:
        """The literal pieces as one regular-expression alternation (one that matches nothing
        when there are none), to build a text search around."""
        return "|".join(re.escape(piece) for piece in self.literal_pieces()) or "(?!)"

    def names_gate_dtype(self, name: str) -> bool:
        """Whether ``name`` is a setting for the gate cache's dtype: ``<gate cache>_dtype``
        (``g_cache_dtype``), ``gate_dtype``, ``g_dtype``, ``gate_ring_dtype`` and the like; a
        constant (``GATE_RING_DTYPE``) is a policy, judged where a ring is made with it."""
        if name.isupper():
            return False
        core = name.lower().lstrip("_")
        if not core.endswith("_dtype"):
            return False
        prefix = core[: -len("_dtype")]
        if prefix in GATE_DTYPE_WORDS or self.matches(prefix):
            return True
        if any(f"{prefix}_{suffix}" in self._learned_lower for suffix in RING_SUFFIXES):
            return True  # `logdecay_dtype` beside a learned `logdecay_ring`
        # `ring_log_decay_dtype`: a qualifier before a word only the gate ring goes by (not
        # `gate` alone: `wkv_gate_dtype`, `moe_gate_dtype` are other gates)
        return any(prefix.endswith(f"_{word}") for word in _GATE_RING_WORDS)

    def is_plural(self, name: str) -> bool:
        """Whether ``name`` matches only as a plural (``g_caches``: a collection of rings)."""
        core = name.lower().lstrip("_")
        return (
            core.endswith("s")
            and self._singular.fullmatch(core) is None
            and self._singular.fullmatch(core[:-1]) is not None
        )

    def learned_from(self, name: str) -> LearnedFrom | None:
        """The call that taught ``name``, if it is a gate cache only because it was learned."""
        if self._matches(name):
            return self._learned_from(name)
        core = _core(name)
        return self._learned_from(core) if core != name and self._matches(core) else None

    def _learned_from(self, name: str) -> LearnedFrom | None:
        if self._regex.fullmatch(name.lower().lstrip("_")) is not None:
            return None
        taught = self._learned_lower.get(name.lower())
        if taught is not None:
            return self.learned[taught]
        qualified = self._qualified.fullmatch(name) or self._extended.fullmatch(name)
        if qualified is not None:
            return self.learned[self._learned_lower[qualified.group(1).lower()]]
        return next(
            (self.learned[taught] for infixed, taught in self._infixed if infixed.fullmatch(name)),
            None,
        )


_LAYER_INDEX = re.compile(r"_\d+\Z")


def _core(name: str) -> str:
    """The ring a name denotes without its place: the last part of a dotted key
    (``layers.0.g_cache``) and without a layer index after it (``g_cache_3``)."""
    last = name.rpartition(".")[2] or name
    return _LAYER_INDEX.sub("", last)
