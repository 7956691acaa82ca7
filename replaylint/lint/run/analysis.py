"""Analysing the files the pre-filter let through: in this process, or in forked worker processes
that share the imported analysis, largest files first.

A cold run may start the analysis early (:class:`EarlyAnalysis`): the files that surely need it
are analysed in workers while this process still runs the last, whole-project learning stages,
which use one core. When those stages learn nothing, the names the workers analysed with are
the run's, and their reports stand; otherwise the workers are stopped and the files analysed
again with the names learned."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, cast

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.run.discovery import Discovered
from replaylint.lint.run.modules import RunModules
from replaylint.lint.run.one_file import lint_file
from replaylint.lint.run.workers import (
    Started,
    can_fork,
    in_workers,
    start_in_workers,
    worker_state,
)

if TYPE_CHECKING:
    from replaylint.lint.engine import Linter

__all__ = ["EarlyAnalysis", "LintJob", "import_analysis", "lint_one", "make_linter", "run_jobs"]

# Analysing fewer bytes than this is faster in this process than starting workers.
_PARALLEL_MIN_BYTES = 48 * 1024

LintJob = tuple[Discovered, Mode, bool, bool]
"""A file to analyse, the mode, whether unsafe fixes apply, whether to keep its source."""


def lint_one(linter: Linter, job: LintJob) -> FileReport:
    item, mode, unsafe, keep_source = job
    # libcst builds a large, acyclic tree per file (freed by reference counting); the cyclic
    # collector's passes while it grows find nothing and cost ~10% of the analysis.
    collecting = gc.isenabled()
    gc.disable()
    try:
        report = lint_file(linter, item, mode, unsafe=unsafe)
    finally:
        if collecting:
            gc.enable()
    if not (keep_source and report.findings):
        report.source = None  # nothing will show it: do not keep (or ship back) the text
    return report


def _lint_in_worker(job: LintJob) -> FileReport:
    return lint_one(cast("Linter", worker_state()), job)


def import_analysis() -> None:
    """Import libcst and the rules now (in the parent, so that forked workers share them)."""
    import replaylint.lint.engine  # noqa: F401


def make_linter(
    settings: Settings, names: GateCacheNames, prefilter: bool, modules: RunModules
) -> Linter:
    from replaylint.lint.engine import Linter

    return Linter(settings, gate_caches=names, prefilter=prefilter, project=modules.index)


def _largest_first(sizes: list[int]) -> list[int]:
    """Positions by decreasing size: a few big files must not end up behind one worker."""
    return sorted(range(len(sizes)), key=lambda i: -sizes[i])


def _worth_workers(jobs: list[LintJob], sizes: list[int], workers: int) -> bool:
    return workers > 1 and len(jobs) >= 2 and sum(sizes) >= _PARALLEL_MIN_BYTES and can_fork()


def run_jobs(
    linter: Linter, jobs: list[LintJob], sizes: list[int], workers: int
) -> list[FileReport]:
    if not _worth_workers(jobs, sizes, workers):
        return [lint_one(linter, job) for job in jobs]
    order = _largest_first(sizes)
    reports: list[FileReport | None] = [None] * len(jobs)
    for position, report in zip(
        order, in_workers(_lint_in_worker, linter, [jobs[i] for i in order], workers), strict=True
    ):
        reports[position] = report
    return [report for report in reports if report is not None]


class EarlyAnalysis:
    """Files analysed in worker processes, started before the run's names are final."""

    def __init__(self, linter: Linter, jobs: list[LintJob], sizes: list[int], workers: int):
        order = _largest_first(sizes)
        self._paths = [jobs[i][0].path for i in order]
        self._started: Started[FileReport] | None = start_in_workers(
            _lint_in_worker, linter, [jobs[i] for i in order], workers
        )

    @classmethod
    def start(
        cls, linter: Linter, jobs: list[LintJob], sizes: list[int], workers: int
    ) -> EarlyAnalysis | None:
        """Start, when the jobs are worth workers and only report (a fix must wait for the
        final names: it writes files the learning stages read)."""
        if not _worth_workers(jobs, sizes, workers) or any(j[1] is not Mode.CHECK for j in jobs):
            return None
        return cls(linter, jobs, sizes, workers)

    def reports(self, valid: bool) -> dict[Path, FileReport]:
        """The reports by path, when the names they were made with are the run's (``valid``);
        otherwise the workers are stopped and nothing is kept."""
        started, self._started = self._started, None
        if started is None:
            return {}
        if not valid:
            started.stop()
            return {}
        return dict(zip(self._paths, started.results(), strict=True))
