"""Names a run learns, as plain strings for the result cache, and the whole-project stage that
learns the rings passed to the project's wrappers of the kernel
(:mod:`replaylint.lint.gatecache.wrappers`), remembered in the cache."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.grep import files_containing
from replaylint.lint.gatecache.learning import (
    learn_handed_names,
    learn_rings_by_order,
    learnable,
    parsed,
)
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.gatecache.ring_order import may_list_rings
from replaylint.lint.gatecache.wrappers import learned_from_wrappers
from replaylint.lint.run.cache import ResultCache
from replaylint.lint.run.getters import read_text

__all__ = ["REASON", "learned_from", "rows_of_learned_rings", "taught_by", "wrapper_rings"]

# Rounds of rows taught by files that name rings learned in the round before: a project's
# chain of files is short.
_ROW_ROUNDS = 3

# what taught a name, in one string: the entry-point call, or why (a ring's place, a getter)
REASON = "reason: "


def taught_by(origin: LearnedFrom) -> str:
    """What taught a name, as one string for the result cache."""
    return f"{REASON}{origin.reason}" if origin.reason else origin.function


def learned_from(path: str, row: int, taught: str) -> LearnedFrom:
    """The origin :func:`taught_by` wrote as ``taught``."""
    if taught.startswith(REASON):
        return LearnedFrom(path, row, "", taught.removeprefix(REASON))
    return LearnedFrom(path, row, taught)


def wrapper_rings(
    settings: Settings,
    stamps: Sequence[tuple[str, int, int, int]],
    readable: list[str],
    names: GateCacheNames,
    merged: dict[str, LearnedFrom],
    cache: ResultCache | None,
    jobs: int,
    kernel_callers: Sequence[str] | None = None,
) -> dict[str, LearnedFrom]:
    """The rings the project's wrappers of the kernel are passed; remembered in the cache under
    every file's size and times and the names learned so far, so that a run in which no file
    changed reads none of them again. ``kernel_callers``: a superset of the files that contain
    an entry point's text, when the run knows one."""

    # a name only guessed from its neighbours may still be seen passed through a wrapper: the
    # stage looks for it again, and what it finds replaces the guess
    certain = {name: origin for name, origin in merged.items() if not origin.guessed}

    def learn() -> dict[str, LearnedFrom]:
        return learned_from_wrappers(
            readable,
            names.with_learned(certain),
            settings.entry_points,
            read_text,
            lambda name: learnable(name, names),
            jobs,
            kernel_callers,
        )

    return _remembered("wrappers", stamps, merged, cache, learn)


def rows_of_learned_rings(
    settings: Settings,
    stamps: Sequence[tuple[str, int, int, int]],
    readable: list[str],
    names: GateCacheNames,
    merged: dict[str, LearnedFrom],
    cache: ResultCache | None,
    jobs: int,
) -> dict[str, LearnedFrom]:
    """The gate rings written in their place in a row (:mod:`~replaylint.lint.gatecache.
    ring_order`) by files that only a learned name makes worth reading: ``state += [time_state,
    d_ring, k_ring, w_log, pos]`` in a file that names no gate cache but ``w_log_ring``, a ring
    another file's decode call taught. The scan learns rows only from the files its own names
    let through; this stage reads the ones the learned names let through, round after round,
    and is remembered in the cache like the wrapper stage. Those files also teach what they hand
    over under a learned name (``{"log_forget": self.forget_buf}``, :func:`~replaylint.lint.
    gatecache.learning.learn_handed_names`)."""
    if not merged:
        return {}

    def learn() -> dict[str, LearnedFrom]:
        learned: dict[str, LearnedFrom] = {}
        fresh = dict(merged)
        for _ in range(_ROW_ROUNDS):
            known = names.with_learned({**merged, **learned})
            needles = [name.lower().encode() for name in fresh]
            if not needles or not all(needle.isascii() for needle in needles):
                break
            relevance = Relevance(known, settings.entry_points)
            fresh = {}
            for path in sorted(files_containing(readable, needles, jobs)):
                text = read_text(path)
                if text is None or not relevance.may_hold_finding(text):
                    continue
                tree = parsed(text, path)
                if tree is None:
                    continue
                found = learn_handed_names(tree, path, known)  # `{"log_forget": self.buf}`
                if may_list_rings(text.encode("utf-8", "surrogatepass")):
                    found = {**learn_rings_by_order(tree, path, names), **found}
                for name, origin in found.items():
                    if not known.matches(name) and name not in fresh and learnable(name, known):
                        fresh[name] = origin
            if not fresh:
                break
            learned.update(fresh)
        return learned

    return _remembered("rows", stamps, merged, cache, learn)


def _remembered(
    stage: str,
    stamps: Sequence[tuple[str, int, int, int]],
    merged: dict[str, LearnedFrom],
    cache: ResultCache | None,
    learn: Callable[[], dict[str, LearnedFrom]],
) -> dict[str, LearnedFrom]:
    """What ``learn`` teaches, remembered in the cache under the stage's name, every file's size
    and times (what the cache trusts a file's entry by) and the names learned so far."""
    if cache is None:
        return learn()
    taught = sorted((n, o.filename, o.row, taught_by(o)) for n, o in merged.items())
    key = hashlib.blake2b(repr((stage, sorted(stamps), taught)).encode(), digest_size=12)
    found, stored = cache.stage(key.hexdigest())
    if found and isinstance(stored, list):
        with contextlib.suppress(TypeError, ValueError):
            return {str(n): learned_from(str(p), int(r), str(t)) for n, p, r, t in stored}
    learned = learn()
    rows = [[n, o.filename, o.row, taught_by(o)] for n, o in sorted(learned.items())]
    cache.put_stage(key.hexdigest(), rows)
    return learned
