"""Gate-cache names that follow from the names of the other rings: ``alpha_rows`` beside
``delta_rows`` and ``key_rows`` when ``alpha_buffer`` is the gate ring beside ``delta_buffer`` and
``key_buffer``.

Code names its three rings in parallel: a pool holds ``delta_buffer``, ``key_buffer`` and
``alpha_buffer``, a gather returns ``delta``, ``key`` and ``alpha``, a graph keeps
``delta_rows``, ``key_rows`` and ``alpha_rows``, a speculative manager ``spec_delta``,
``spec_key`` and ``spec_alpha``. Once a gate-cache name (by pattern or learned) appears in a file,
its first or last word (``alpha``) may be the gate ring's *stem*: another name of the file with that word
(``alpha_rows``) is a gate cache when the same name with the word replaced by the d ring's
(``d``, ``delta``) and by the k ring's (``k``, ``key``) both appear in the file too. Words that
name a tensor's metadata (``_shape``, ``_dtype``, ``_idx`` ...) form no ring names, and names too
generic to mean the gate ring are never derived, nor names of one step's entry (``g_row``,
``g_step``), which the code writes into a ring. The derivation is per file: the evidence is the
file's own identifiers.
"""

from __future__ import annotations

import re

from replaylint.lint.gatecache.names import NAMED_LIKE, GateCacheNames, LearnedFrom

_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_METADATA = frozenset(
    {"shape", "shapes", "dtype", "dtypes", "size", "sizes", "bytes", "numel", "stride", "strides"}
    | {"idx", "index", "indices", "offset", "offsets", "len", "dim", "dims"}
    | {"name", "names", "tag", "id", "ids", "slice", "start", "end", "count"}
)
_GENERIC = frozenset(
    {"g", "gate", "gates", "x", "a", "b", "t", "out", "value", "data", "tmp"}
    | {"buf", "bufs", "buffer", "cache", "ring", "state", "tensor", "log", "logs"}
)
# words of a name for one step's entry, which the code writes into a ring (`g_row` beside `d_row`
# and `k_row`): such a value is not a ring, and a copy into the ring casts it
_ONE_STEP = frozenset({"row", "step"})
# the words that name the d and the k ring, the one-letter word first
D_WORDS = ("d", "delta", "deltas")
K_WORDS = ("k", "key", "keys")
# what every ring of a family shares, so never the gate ring's own word
_SHARED = frozenset({"cache", "caches", "buffer", "buffers", "ring", "rings", "rows", "row"})
_SHARED_MORE = frozenset({"state", "states", "tensor", "tensors", "pool", "slots", "host"})


def sibling_names(names: GateCacheNames, text: str, filename: str) -> dict[str, LearnedFrom]:
    """Names of the file ``text`` that are gate caches because of their siblings (see the module
    docstring), each with why."""
    identifiers = set(_IDENTIFIER.findall(text))
    stems: dict[str, str] = {}  # a word of a gate-cache name -> that name
    for gate in sorted(name for name in identifiers if names.matches(name)):
        words = [word for word in gate.split("_") if word]
        # the ring's own word comes first or last (`alpha_buffer`, `log_alpha`); a word in the
        # middle qualifies it (`alpha_move_buffer`). Where the file names the gate ring's
        # siblings (`d_buf` and `k_buf` beside `decay_buf`), the word they replace is its own
        # and the word they share (`buf`) is not.
        ends = list(dict.fromkeys(words[:1] + words[-1:]))
        own = [w for i, w in enumerate(words) if w in ends and _siblings(words, i, identifiers)]
        # ... and where they replace a word in the middle (`snapshot_kda_delta_ring` beside
        # `snapshot_kda_gate_ring`), that word is its own and the ends qualify it
        inner = [w for i, w in enumerate(words) if _siblings(words, i, identifiers)]
        for word in own or inner or ends:
            lowered = word.lower()
            if (
                word
                and lowered not in _METADATA
                and lowered not in _SHARED | _SHARED_MORE
                and lowered not in (*D_WORDS, *K_WORDS)
            ):
                stems.setdefault(word, gate)
    derived: dict[str, LearnedFrom] = {}
    for name in sorted(identifiers):
        if name in derived or names.matches(name) or name.lower() in _GENERIC or len(name) <= 2:
            continue
        words = name.split("_")
        if any(word.lower() in _METADATA or word.lower() in _ONE_STEP for word in words):
            continue
        for position, word in enumerate(words):
            gate = stems.get(word)
            if gate is None:
                continue
            siblings = _siblings(words, position, identifiers)
            if siblings is not None:
                d_name, k_name = siblings
                reason = f"{NAMED_LIKE} `{gate}` beside `{d_name}` and `{k_name}`"
                derived[name] = LearnedFrom(filename, _first_row(text, name), "", reason)
                break
    return derived


def _siblings(words: list[str], position: int, identifiers: set[str]) -> tuple[str, str] | None:
    """The d and the k ring's names in the file: ``words`` with the word at ``position`` replaced
    by a d word and by a k word; None unless both are there."""
    # a one-word name needs whole words beside it (`delta`, `key`), not `d` and `k`
    d_words, k_words = (D_WORDS[1:], K_WORDS[1:]) if len(words) == 1 else (D_WORDS, K_WORDS)
    d_name = _replaced(words, position, d_words, identifiers)
    k_name = _replaced(words, position, k_words, identifiers)
    return None if d_name is None or k_name is None else (d_name, k_name)


def _replaced(
    words: list[str], position: int, replacements: tuple[str, ...], identifiers: set[str]
) -> str | None:
    """The first name of ``identifiers`` that is ``words`` with the word at ``position`` replaced
    by one of ``replacements``."""
    for replacement in replacements:
        candidate = "_".join([*words[:position], replacement, *words[position + 1 :]])
        if candidate in identifiers:
            return candidate
    return None


def _first_row(text: str, name: str) -> int:
    match = re.search(rf"\b{re.escape(name)}\b", text)
    return text.count("\n", 0, match.start()) + 1 if match else 1
