"""Linting many files: the learning pass, the result cache and process-level parallelism.

A run reads each file's size and modification time first. Files the cache already knows in that
state are not read again; the others are read once to learn the gate-cache names their decode
calls teach. With the learned names fixed, every file whose cached results were computed with the
same names is answered from the cache; the rest are linted — in worker processes when there are
enough of them — and the reports come back in path order whatever the scheduling.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from replaylint.lint.discovery import Discovered
from replaylint.lint.engine import Linter
from replaylint.lint.gate_caches import GateCacheNames, LearnedFrom
from replaylint.lint.learning import entry_point_needles, learn_gate_cache_names
from replaylint.lint.result_cache import CachedFile, ResultCache, digest
from replaylint.lint.runner import FileReport, Mode, lint_file
from replaylint.lint.source_io import FileProblem, decode_source

# Below this many files to lint, starting worker processes costs more than it saves.
_PARALLEL_THRESHOLD = 8


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class _Known:
    """What the learning pass found out about one file."""

    size: int
    mtime_ns: int
    digest: str
    learned: tuple[tuple[str, int, str], ...]
    cached: CachedFile | None
    candidate: bool = True
    """False when the pre-filter's first stage already rules out any finding."""


def _stat(path: Path) -> tuple[int, int] | None:
    """Size and mtime of a regular file; None for anything else (a FIFO must not be read here)."""
    try:
        status = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return status.st_size, status.st_mtime_ns


def _learn_one(linter: Linter, filename: str, raw: bytes) -> tuple[tuple[str, int, str], ...]:
    needles = entry_point_needles(linter.settings.entry_points)
    if needles is not None and not any(needle.encode() in raw for needle in needles):
        return ()
    try:
        text, _ = decode_source(raw)
    except FileProblem:
        return ()
    # As in a whole-run learning pass: names the patterns already match need no teaching.
    base = GateCacheNames(linter.gate_caches.patterns)
    learned = learn_gate_cache_names([(filename, text)], linter.settings.entry_points, base)
    return tuple((name, origin.row, origin.function) for name, origin in learned.items())


def _learning_pass(
    linter: Linter, items: Sequence[Discovered], cache: ResultCache | None
) -> dict[Path, _Known]:
    known: dict[Path, _Known] = {}
    merged: dict[str, LearnedFrom] = {}
    for item in items:
        filename = str(item.path)
        status = _stat(item.path)
        if status is None:
            continue  # the lint pass reports it
        cached = cache.get(item.path, filename) if cache is not None else None
        if cached is not None and (cached.size, cached.mtime_ns) == status:
            known[item.path] = _Known(*status, cached.digest, cached.learned, cached)
        else:
            try:
                raw = item.path.read_bytes()
            except OSError:
                continue
            content = digest(raw)
            if cached is not None and cached.digest != content:
                cached = None
            learned = cached.learned if cached is not None else _learn_one(linter, filename, raw)
            candidate = not linter.prefilter or linter.relevance.may_hold_finding_raw(raw)
            known[item.path] = _Known(len(raw), status[1], content, learned, cached, candidate)
        for name, row, function in known[item.path].learned:
            if name not in merged and not linter.gate_caches.matches(name):
                merged[name] = LearnedFrom(filename, row, function)
    if merged:
        linter.gate_caches = linter.gate_caches.with_learned(merged)
        # Learned names are needles too: look again at the files the first stage ruled out.
        for path, info in known.items():
            if not info.candidate:
                try:
                    info.candidate = linter.relevance.may_hold_finding_raw(path.read_bytes())
                except OSError:
                    info.candidate = True
    return known


def _learned_key(linter: Linter) -> str:
    learned = sorted(
        (name, origin.filename, origin.row, origin.function)
        for name, origin in linter.gate_caches.learned.items()
    )
    return hashlib.blake2b(repr(learned).encode(), digest_size=12).hexdigest()


def _cached_report(
    item: Discovered, cached: CachedFile, mode: Mode, unsafe: bool
) -> FileReport | None:
    """The report the cache answers for, or None when the file must be linted again."""
    filename = str(item.path)
    if cached.findings is None:
        return None
    report = FileReport(filename, findings=list(cached.findings), unsafe_fixes=unsafe)
    if mode is not Mode.CHECK and any(report.fixable(f) for f in report.findings):
        return None  # there is something to fix: do it
    if report.findings:
        try:  # the text reporter shows source lines
            report.source = decode_source(item.path.read_bytes())[0]
        except (OSError, FileProblem):
            return None
    return report


# The linter of a worker process, inherited from the parent when the pool forks.
_WORKER_LINTER: Linter | None = None


def _lint_in_worker(job: tuple[Discovered, Mode, bool]) -> FileReport:
    assert _WORKER_LINTER is not None
    item, mode, unsafe = job
    report = lint_file(_WORKER_LINTER, item, mode, unsafe=unsafe)
    if not report.findings:
        report.source = None  # nothing to show: do not ship the text back
    return report


def _run_jobs(
    linter: Linter, jobs: list[tuple[Discovered, Mode, bool]], workers: int
) -> list[FileReport]:
    global _WORKER_LINTER
    if (
        workers <= 1
        or len(jobs) < _PARALLEL_THRESHOLD
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return [lint_file(linter, item, mode, unsafe=unsafe) for item, mode, unsafe in jobs]
    # Largest files first, one at a time: a few big files must not end up behind one worker.
    order = sorted(range(len(jobs)), key=lambda i: -_size(jobs[i][0].path))
    _WORKER_LINTER = linter
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            done = list(pool.map(_lint_in_worker, [jobs[i] for i in order]))
    finally:
        _WORKER_LINTER = None
    reports: list[FileReport | None] = [None] * len(jobs)
    for position, report in zip(order, done, strict=True):
        reports[position] = report
    return [report for report in reports if report is not None]


def _size(path: Path) -> int:
    status = _stat(path)
    return status[0] if status is not None else 0


def lint_many(
    linter: Linter,
    items: Sequence[Discovered],
    mode: Mode,
    *,
    unsafe: bool = False,
    cache: ResultCache | None = None,
    jobs: int = 1,
) -> list[FileReport]:
    """Lint ``items``; reports in the order of ``items``."""
    known = _learning_pass(linter, items, cache)
    learned_key = _learned_key(linter)
    reports: dict[Path, FileReport] = {}
    to_lint: list[tuple[Discovered, Mode, bool]] = []
    for item in items:
        info = known.get(item.path)
        cached = info.cached if info is not None else None
        if cached is not None and cached.learned_key == learned_key:
            report = _cached_report(item, cached, mode, unsafe)
            if report is not None:
                reports[item.path] = report
                continue
        if info is not None and not info.candidate:
            reports[item.path] = FileReport(str(item.path), unsafe_fixes=unsafe)
            if cache is not None and mode is not Mode.DIFF:
                cache.put(
                    item.path,
                    CachedFile(
                        info.size, info.mtime_ns, info.digest, info.learned, learned_key, ()
                    ),
                )
            continue
        to_lint.append((item, mode, unsafe))
    for (item, _, _), report in zip(to_lint, _run_jobs(linter, to_lint, jobs), strict=True):
        reports[item.path] = report
        if cache is not None and mode is not Mode.DIFF:
            _remember(cache, item, report, known.get(item.path), learned_key, linter)
    if cache is not None and mode is not Mode.DIFF:
        cache.save()
    return [reports[item.path] for item in items]


def _remember(
    cache: ResultCache,
    item: Discovered,
    report: FileReport,
    info: _Known | None,
    learned_key: str,
    linter: Linter,
) -> None:
    if report.error is not None:
        return  # errors are rare and worded for this run's paths: lint such files again
    try:
        raw = item.path.read_bytes() if report.changed or info is None else None
        status = item.path.stat()
    except OSError:
        return
    if raw is not None:  # fixed (or not seen by the learning pass): describe the new content
        content, learned = digest(raw), _learn_one(linter, str(item.path), raw)
    else:
        assert info is not None
        if (info.size, info.mtime_ns) != (status.st_size, status.st_mtime_ns):
            return  # changed while we ran: do not vouch for it
        content, learned = info.digest, info.learned
    cache.put(
        item.path,
        CachedFile(
            size=status.st_size,
            mtime_ns=status.st_mtime_ns,
            digest=content,
            learned=learned,
            learned_key=learned_key,
            findings=tuple(report.findings),
        ),
    )
