"""Running a function over many jobs in forked worker processes that share the parent's state.

The parent imports what the workers need (libcst, the rules) and builds their state (a scanner, a
linter) once; forked workers inherit both, so nothing is pickled but the jobs and the results.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from multiprocessing.pool import AsyncResult, Pool

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


class Started(Generic[_Result]):
    """Jobs running in worker processes (:func:`start_in_workers`) while this process goes on:
    their results are collected, or the work is stopped."""

    def __init__(self, pool: Pool, pending: list[AsyncResult[_Result]]) -> None:
        self._pool, self._pending = pool, pending

    def results(self) -> list[_Result]:
        """The results in the order of the jobs, once every job is done."""
        try:
            results = [pending.get() for pending in self._pending]
        except BaseException:
            self.stop()
            raise
        self._pool.close()
        self._pool.join()
        return results

    def stop(self) -> None:
        """End the workers now; results not yet collected are lost."""
        self._pool.terminate()
        self._pool.join()


def start_in_workers(
    function: Callable[[_Job], _Result], state: object, jobs: list[_Job], workers: int
) -> Started[_Result]:
    """Start ``function`` over ``jobs`` (one at a time, in order) in ``workers`` forked processes
    that see ``state``, and return at once."""
    import multiprocessing

    global _WORKER_STATE
    _WORKER_STATE = state
    gc.freeze()  # as in :func:`in_workers`
    try:  # the pool forks its workers as it is made
        pool = multiprocessing.get_context("fork").Pool(min(workers, len(jobs)))
    finally:
        gc.unfreeze()
        _WORKER_STATE = None
    return Started(pool, [pool.apply_async(function, (job,)) for job in jobs])
