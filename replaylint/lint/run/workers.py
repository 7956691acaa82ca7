"""Running a function over many jobs in forked worker processes that share the parent's state.

The parent imports what the workers need (libcst, the rules) and builds their state (a scanner, a
linter) once; forked workers inherit both, so nothing is pickled but the jobs and the results.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TypeVar

_Job = TypeVar("_Job")
_Result = TypeVar("_Result")


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# What a worker process works with (a scanner or a linter), inherited when the pool forks.
_WORKER_STATE: object = None


def worker_state() -> object:
    """The state :func:`in_workers` handed this worker process."""
    return _WORKER_STATE


def can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def in_workers(
    function: Callable[[_Job], _Result],
    state: object,
    jobs: list[_Job],
    workers: int,
    chunk: int = 1,
    meanwhile: Callable[[], object] | None = None,
) -> list[_Result]:
    """``function`` over ``jobs`` in ``workers`` forked processes that see ``state``, ``chunk``
    jobs at a time; results in the order of ``jobs``, whatever the scheduling. ``meanwhile``
    runs here while the workers work."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _WORKER_STATE
    _WORKER_STATE = state
    # Objects that exist now (the imported analysis, the state) stay out of the collector's
    # passes in the workers, which then neither scan them nor copy their pages by touching them.
    gc.freeze()
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
            results = pool.map(function, jobs, chunksize=chunk)  # forks and submits every job
            if meanwhile is not None:
                meanwhile()
            return list(results)
    finally:
        gc.unfreeze()
        _WORKER_STATE = None
