"""Names a run learns, as plain strings for the result cache, and the whole-project stage that
learns the rings passed to the project's wrappers of the kernel
(:mod:`replaylint.lint.gatecache.wrappers`), remembered in the cache."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.learning import learnable
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.wrappers import learned_from_wrappers
from replaylint.lint.run.cache import ResultCache
from replaylint.lint.run.getters import read_text

__all__ = ["REASON", "learned_from", "taught_by", "wrapper_rings"]

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
    key = None
    if cache is not None:
        # size, mtime and ctime: what the cache trusts a file's entry by
        contents = sorted(stamps)
        taught = sorted((n, o.filename, o.row, taught_by(o)) for n, o in merged.items())
        key = hashlib.blake2b(repr(("wrappers", contents, taught)).encode(), digest_size=12)
        found, stored = cache.stage(key.hexdigest())
        if found and isinstance(stored, list):
            with contextlib.suppress(TypeError, ValueError):
                return {str(n): learned_from(str(p), int(r), str(t)) for n, p, r, t in stored}
    learned = learned_from_wrappers(
        readable,
        names.with_learned(merged),
        settings.entry_points,
        read_text,
        lambda name: learnable(name, names),
        jobs,
        kernel_callers,
    )
    if cache is not None and key is not None:
        rows = [[n, o.filename, o.row, taught_by(o)] for n, o in sorted(learned.items())]
        cache.put_stage(key.hexdigest(), rows)
    return learned
