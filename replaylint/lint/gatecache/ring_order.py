"""The gate ring by its place: ReplaySSM code lists its rings in the kernel's order, d, k, g.

Whatever a project calls its rings, it tends to write them in the order the decode kernel takes
them: ``self.d_states, self.k_states, self.decay_states = [], [], []``,
``return self.temp_d, self.temp_k, temp_decay``,
``RING_NAMES = ("cache_state", "cache_delta", "cache_key", "cache_gate")``,
``ReplayStateChunk(state, d_ring, k_ring, log_gate_ring, 0)``. Three names in a row (tuple or
list elements, a call's positional arguments, unpacking targets, strings) that are one name with
a d-ring word, then a k-ring word, then another word in the same place (``nc_d, nc_k, nc_decay``,
``delta_rows, key_rows, alpha_rows``) make the third the gate ring. A one-word name needs whole
words (``delta, key, alpha``), and words that name metadata (``_shape``, ``_dtype``) or are too
generic to mean the gate ring (``g``, ``x``) are never taken. Five names in the kernel's own
order pin the gate ring whatever it is called: the checkpoint, the d and the k ring, the gate
ring, the cursor (``state += [time_state, d_ring, k_ring, w_log, pos]``).

Declarations name their rings too: the fields of a record class (``d: Tensor``, ``k: Tensor``,
``decay: Tensor``), the keywords of a call (``Seed(d=..., k=..., decay=...)``) and the keys of a
dict literal (``{"d": ..., "k": ..., "decay": ...}``). There the one-letter ``d`` and ``k`` count
as the ring words: a declaration spells each field out, so ``d, k, decay`` in that order is a
ring layout, where a tuple ``(d, k, x)`` may be dimensions or counts.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from replaylint.lint.gatecache.names import WRITTEN_AFTER, LearnedFrom
from replaylint.lint.gatecache.siblings import D_WORDS, K_WORDS
from replaylint.lint.syntax.ast_walk import walk

_D_WORDS, _K_WORDS = frozenset(D_WORDS), frozenset(K_WORDS)
_WHOLE_D, _WHOLE_K = frozenset(D_WORDS[1:]), frozenset(K_WORDS[1:])
_METADATA = frozenset(
    {"shape", "shapes", "dtype", "dtypes", "size", "sizes", "bytes", "numel", "stride", "strides"}
    | {"idx", "index", "indices", "offset", "offsets", "len", "dim", "dims", "name", "names"}
    | {"scale", "scales", "zero", "zeros", "proj", "weight", "weights", "bias", "norm", "head"}
    | {"heads", "model", "v", "value", "values", "q", "query"}
)
_GENERIC = frozenset({"g", "gate", "gates", "x", "a", "b", "t", "out", "value", "data", "tmp"})
# what else a decode state holds beside its rings: never the gate ring's own word
_NOT_RINGS = frozenset(
    {"state", "states", "checkpoint", "checkpoints", "pos", "position", "positions", "slot"}
    | {"slots", "cursor", "cursors", "length", "lengths", "count", "counts", "mask", "masks"}
    | {"seqlen", "seqlens", "step", "steps", "ptr", "id", "ids", "num", "n"}
)
# a name with a d-ring word, a comma, a name with a k-ring word: the text of a row of rings
# (it starts with the d: a pattern that starts with a letter is searched letter-first, many times
# faster than one that starts with a look-behind)
_ROW = re.compile(
    rb"d(?<![A-Za-z0-9]d)(?:elta)?(?:_\w*)?(?:\[[^\]\n]{0,24}\])?[\"']?[ \t]*,[ \t\n]*[\"']?"
    rb"(?:[A-Za-z_]\w*\.)?"
    rb"(?:[A-Za-z0-9]+_)*(?:k|key)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
# or one assignment under the other: `self.delta = ...` then `self.key = ...`
_STATEMENT_ROW = re.compile(
    rb"\.(?:[A-Za-z0-9]+_)*(?:d|delta)(?:_\w*)?[ \t]*=(?!=)[^\n]*\n"
    rb"[ \t]*[A-Za-z_][\w.]*\.(?:[A-Za-z0-9]+_)*(?:k|key)(?:_\w*)?[ \t]*=(?!=)",
    re.IGNORECASE,
)


# a declaration row: `d: Tensor` over `k: Tensor` (fields), `d=..., k=...` (keywords) or
# `"d": ..., "k": ...` (keys); the value between the two names is short
_DECLARED_ROW = re.compile(
    rb"(?<![A-Za-z0-9_.])[\"']?(?:[A-Za-z0-9]+_)*(?:d|delta)(?:_\w*)?[\"']?[ \t]*[:=](?!=)"
    rb"[^\n]{0,200}(?:,|\n)[ \t\n]*"
    rb"[\"']?(?:[A-Za-z0-9]+_)*(?:k|key)(?:_\w*)?[\"']?[ \t]*[:=](?!=)",
    re.IGNORECASE,
)
# the d word of the first name of a row and what follows it: where a search for the row starts
_DECLARED_D = re.compile(rb"d(?<![A-Za-z0-9]d)(?:elta)?(?:_\w*)?[\"']?[ \t]*[:=](?!=)", re.I)
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def may_list_rings(raw: bytes) -> bool:
    """Whether ``raw`` may write a row of rings (cheap: parse only the files that may)."""
    return (
        _ROW.search(raw) is not None or _STATEMENT_ROW.search(raw) is not None or _declared_row(raw)
    )


def _declared_row(raw: bytes) -> bool:
    """``_DECLARED_ROW.search(raw)``, tried only at the names whose d word ``_DECLARED_D`` finds:
    the pattern opens with a look-behind and a repeated group, which a search would try at
    every byte (several times slower)."""
    for found in _DECLARED_D.finditer(raw):
        start = found.start()
        while start > 0 and raw[start - 1] in _WORD_BYTES:
            start -= 1
        if _DECLARED_ROW.match(raw, start) is not None:
            return True
    return False


def gate_rings_by_order(tree: ast.AST, filename: str) -> Iterator[tuple[str, LearnedFrom]]:
    """The names ``tree`` writes right after a d ring and a k ring of the same family."""
    for node in walk(tree):
        if not isinstance(node, _ROW_HOLDERS):
            continue
        declared = _declared_rows(node)
        rows = [([written_name(element) for element in row], False) for row in _rows(node)]
        for names, _ in rows:
            for found in _kernel_rows(names):
                reason = (
                    f"{WRITTEN_AFTER} `{found[1]}` and `{found[2]}`, in the place of the gate ring"
                )
                yield found[3], LearnedFrom(filename, getattr(node, "lineno", 1), "", reason)
        for names, one_letter in [*rows, *((row, True) for row in declared)]:
            for first, second, third in zip(names, names[1:], names[2:], strict=False):
                if (
                    first
                    and second
                    and third
                    and _third_of_family(first, second, third, one_letter=one_letter)
                ):
                    reason = (
                        f"{WRITTEN_AFTER} `{first}` and `{second}`, in the place of the gate ring"
                    )
                    yield third, LearnedFrom(filename, getattr(node, "lineno", 1), "", reason)


_BLOCKS: tuple[type[ast.AST], ...] = (
    *(ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For),
    *(ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.ExceptHandler),
)  # nodes with statement blocks


_ROW_HOLDERS = (ast.Tuple, ast.List, ast.Call, ast.Dict, *_BLOCKS)


def _rows(node: ast.AST) -> Iterator[Sequence[ast.expr]]:
    if isinstance(node, (ast.Tuple, ast.List)):
        yield node.elts
    elif isinstance(node, ast.Call):
        yield node.args
    # statements in a row: `self.delta = ...`, `self.key = ...`, `self.log_alpha = ...` (rings
    # an object keeps; locals in a row are views and temporaries of one function)
    if not isinstance(node, _BLOCKS):
        return
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if not isinstance(block, list):
            continue
        targets: list[ast.expr] = []
        for statement in [*block, None]:
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Attribute)
            ):
                targets.append(statement.targets[0])
                continue
            if len(targets) >= 3:
                yield targets
            targets = []


def _declared_rows(node: ast.AST) -> list[list[str | None]]:
    """The field names of a class body, the keywords of a call, the string keys of a dict."""
    if isinstance(node, ast.ClassDef):
        fields: list[str | None] = []
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                fields.append(statement.target.id)
        return [fields]
    if isinstance(node, ast.Call):
        return [[keyword.arg for keyword in node.keywords]] if len(node.keywords) >= 3 else []
    if isinstance(node, ast.Dict):
        return [[written_name(key) if key is not None else None for key in node.keys]]
    return []


def written_name(expr: ast.expr) -> str | None:
    """``ring`` for ``ring``, ``self.ring``, ``self.ring[i]``, ``"ring"``."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value.isidentifier():
        return expr.value
    return None


def _kernel_rows(names: Sequence[str | None]) -> Iterator[tuple[str, str, str, str, str]]:
    """Five names in the decode kernel's order, its state, the d and the k ring (one family),
    the gate ring and the cursor (``time_state, d_ring, k_ring, w_log, pos``): the fourth is the
    gate ring whatever it is called, the checkpoint before and the cursor after pinning it."""
    for window in zip(names, names[1:], names[2:], names[3:], names[4:], strict=False):
        state, d_name, k_name, gate, cursor = window
        if not (state and d_name and k_name and gate and cursor):
            continue
        state_words = set(state.lower().split("_"))
        cursor_words = set(cursor.lower().split("_"))
        gate_words = gate.lower().split("_")
        if (
            state_words & _CHECKPOINT_WORDS
            and cursor_words & _CURSOR_WORDS
            and _family_place(d_name.lower().split("_"), k_name.lower().split("_")) is not None
            and gate.lower() not in _GENERIC
            and len(gate) > 2
            and not any(w in _D_WORDS | _K_WORDS | _METADATA | _NOT_RINGS for w in gate_words)
        ):
            yield state, d_name, k_name, gate, cursor


_CHECKPOINT_WORDS = frozenset({"state", "states", "checkpoint", "kv", "ssm"})
_CURSOR_WORDS = frozenset({"pos", "position", "positions", "cursor", "cursors", "steps", "ptr"})


def _family_place(
    d_words: list[str], k_words: list[str], *, one_letter: bool = False
) -> int | None:
    """Where the words of a d ring's and a k ring's name differ, when they differ in that one
    place only and by a d-ring word and a k-ring word there (whole words for a one-word name,
    unless ``one_letter``: a declaration spells each field out)."""
    if len(d_words) != len(k_words):
        return None
    differing = [i for i, (d, k) in enumerate(zip(d_words, k_words, strict=True)) if d != k]
    if len(differing) != 1:
        return None
    place = differing[0]
    whole = len(d_words) == 1 and not one_letter
    if d_words[place] in (_WHOLE_D if whole else _D_WORDS) and k_words[place] in (
        _WHOLE_K if whole else _K_WORDS
    ):
        return place
    return None


def _third_of_family(first: str, second: str, third: str, *, one_letter: bool = False) -> bool:
    """``nc_d, nc_k, nc_decay``; ``d_ring, k_ring, log_gate_ring`` (the gate ring's own word may
    be several); ``delta, key, alpha``; with ``one_letter`` (a declaration), ``d, k, decay``."""
    d_words, k_words, own_words = (name.lower().split("_") for name in (first, second, third))
    if third.lower() in _GENERIC or len(third) <= 2:
        return False
    place = _family_place(d_words, k_words, one_letter=one_letter)
    if place is None:
        return False
    prefix, suffix = d_words[:place], d_words[place + 1 :]
    middle = own_words[len(prefix) : len(own_words) - len(suffix)]
    return (
        own_words[: len(prefix)] == prefix
        and own_words[len(own_words) - len(suffix) :] == suffix
        and bool(middle)
        and not any(word in _D_WORDS | _K_WORDS | _METADATA | _NOT_RINGS for word in middle)
        and not any(word in _METADATA for word in own_words)
    )
