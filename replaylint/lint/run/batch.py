"""Linting many files: the result cache, the learning pass, the pre-filter and parallel analysis.

A run looks at each file's size and modification time first: files the cache knows in that state
are not read at all. The others are scanned: one ``grep`` per core finds the few files that name a
gate cache or a decode entry point (:mod:`replaylint.lint.gatecache.grep`), and only those are read
here, to learn the gate-cache names their decode calls teach and to confirm, word by word, that
they may hold a finding. With the learned names fixed, every file whose cached results were
computed with the same names is answered from the cache; the rest are analysed — in worker
processes when there is enough work — and the reports come back in path order.

The analysis (libcst and the rules) is imported only when some file must be analysed, so a run
answered from the cache costs little more than start-up, discovery and one ``stat`` per file.
"""

from __future__ import annotations

import gc
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.learning import (
    entry_point_needles,
    learn_gate_cache_names,
    learn_rings_by_order,
    learning_needles,
)
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.gatecache.ring_order import may_list_rings
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.run.cache import CachedFile, ResultCache, StoredFile, digest
from replaylint.lint.run.discovery import Discovered
from replaylint.lint.run.files import FileProblem, decode_source
from replaylint.lint.run.getters import learned_from_getters
from replaylint.lint.run.modules import RunModules
from replaylint.lint.run.name_tables import files_reading, name_table_constants
from replaylint.lint.run.one_file import lint_file
from replaylint.lint.run.taught import learned_from, taught_by, wrapper_rings
from replaylint.lint.run.workers import can_fork, in_workers, worker_state

if TYPE_CHECKING:
    from replaylint.lint.engine import Linter

# Analysing fewer bytes than this is faster in this process than starting workers.
_PARALLEL_MIN_BYTES = 48 * 1024
# Scanning more files than this starts with grep over all of them (gatecache/grep.py).
_SEARCH_MIN_FILES = 64
# Reading and classifying more files than this is spread over worker processes.
_PARALLEL_MIN_SCANS = 32

_Learned = tuple[tuple[str, int, str], ...]
_LintJob = tuple[Discovered, Mode, bool, bool]
"""A file to analyse, the mode, whether unsafe fixes apply, whether to keep its source."""


@dataclass
class _File:
    """What this run knows about one file before analysing it."""

    item: Discovered
    key: str
    """The absolute path: the file's key in the result cache."""
    size: int
    mtime_ns: int
    ctime_ns: int
    stored: StoredFile | None = None
    """The cache's entry, when it describes the file's current content."""
    digest: str = ""
    learned: _Learned = ()
    stage_one: bool = False
    """The file's bytes contain a pre-filter needle (so it may need analysing)."""
    candidate: bool = False
    """The pre-filter could not rule a finding out: the file must be analysed."""
    scanned: bool = False
    """Read (or ruled out by the tree search) in this run."""


def _regular_file(path: str) -> tuple[int, int, int] | None:
    """Size, mtime and ctime of a regular file; None for anything else (a FIFO must not be read
    here)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _learn(settings: Settings, filename: str, raw: bytes, relevant: bool) -> _Learned:
    """What ``raw`` teaches: decode calls and keywords, and (in a file the pre-filter lets through,
    ``relevant``, when it writes rings in a row) the ring in the gate ring's place."""
    # As in a whole-run learning pass: names the patterns already match need no teaching.
    base = GateCacheNames(settings.gate_cache_patterns)
    needles = learning_needles(settings.entry_points, base)
    rings_only = needles is not None and not any(needle.encode() in raw for needle in needles)
    if rings_only and not (relevant and may_list_rings(raw)):
        return ()
    try:
        text, _ = decode_source(raw)
    except FileProblem:
        return ()
    if rings_only:
        learned = learn_rings_by_order(text, filename, base)
    else:
        learned = learn_gate_cache_names([(filename, text)], settings.entry_points, base)
    return tuple((name, origin.row, taught_by(origin)) for name, origin in learned.items())


def _classify(relevance: Relevance, raw: bytes) -> tuple[bool, bool]:
    """The pre-filter's two stages on a file's bytes: (passes stage one, may hold a finding)."""
    if not relevance.may_hold_finding_raw(raw):
        return False, False
    try:
        text, _ = decode_source(raw)
    except FileProblem:
        return True, True  # the analysis reports the problem
    return True, relevance.may_hold_finding(text)


@dataclass(frozen=True)
class _Scanned:
    """What reading one file told."""

    digest: str
    learned: _Learned | None
    """None: the content is the cache entry's, and so are the names it teaches."""
    stage_one: bool
    candidate: bool


class _Scanner:
    """Reads files that may matter: learning, content digests and the pre-filter."""

    def __init__(self, settings: Settings, relevance: Relevance, *, digests: bool) -> None:
        self.settings = settings
        self.relevance = relevance
        self.digests = digests

    def needles(self) -> list[bytes] | None:
        """Lower-case ASCII text that every file worth reading contains; None: read them all."""
        stage_one = self.relevance.byte_needles
        learning = entry_point_needles(self.settings.entry_points)
        if stage_one is None or learning is None:
            return None
        needles = {*stage_one, *(needle.lower().encode() for needle in learning)}
        if not all(needle.isascii() for needle in needles):
            return None
        return sorted(needles)

    def read(self, path: str, stored_digest: str) -> _Scanned | None:
        """Read and classify one file; None when it cannot be read (the analysis reports it)."""
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        content = digest(raw) if self.digests else ""
        same = bool(stored_digest) and stored_digest == content
        stage_one, candidate = _classify(self.relevance, raw)
        return _Scanned(
            digest=content,
            learned=None if same else _learn(self.settings, path, raw, candidate),
            stage_one=stage_one,
            candidate=candidate,
        )

    def scan(self, info: _File) -> bool:
        """Read and classify ``info``'s file in this process."""
        return _apply(info, self.read(str(info.item.path), _stored_digest(info)))


def _stored_digest(info: _File) -> str:
    return info.stored.digest if info.stored is not None else ""


def _apply(info: _File, scanned: _Scanned | None) -> bool:
    if scanned is None:
        return False
    info.scanned = True
    info.digest = scanned.digest
    if scanned.learned is None:
        assert info.stored is not None
        info.learned = info.stored.learned
    else:
        info.stored, info.learned = None, scanned.learned  # new content: the entry is stale
    info.stage_one, info.candidate = scanned.stage_one, scanned.candidate
    return True


def _learned_key(names: GateCacheNames, tables: frozenset[str]) -> str:
    learned = sorted(
        (name, origin.filename, origin.row, taught_by(origin))
        for name, origin in names.learned.items()
    )
    return hashlib.blake2b(repr((learned, sorted(tables))).encode(), digest_size=12).hexdigest()


def _cached_report(
    info: _File, stored: StoredFile, mode: Mode, unsafe: bool, keep_sources: bool
) -> FileReport | None:
    """The report the cache answers for, or None when the file must be linted again."""
    filename = str(info.item.path)
    findings = stored.findings(filename)
    if findings is None:
        return None
    report = FileReport(
        filename, findings=list(findings), unsafe_fixes=unsafe, dependencies=stored.dependencies
    )
    if mode is not Mode.CHECK and any(report.fixable(f) for f in report.findings):
        return None  # there is something to fix: do it
    if report.findings and keep_sources:
        try:  # the text reporter shows source lines
            report.source = decode_source(info.item.path.read_bytes())[0]
        except (OSError, FileProblem):
            return None
    return report


def _scan_in_worker(job: tuple[str, str]) -> _Scanned | None:
    state = worker_state()
    assert isinstance(state, _Scanner)
    return state.read(*job)


def _lint_one(linter: Linter, job: _LintJob) -> FileReport:
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


def _lint_in_worker(job: _LintJob) -> FileReport:
    return _lint_one(cast("Linter", worker_state()), job)


def _import_analysis() -> None:
    """Import libcst and the rules now (in the parent, so that forked workers share them)."""
    import replaylint.lint.engine  # noqa: F401


def _make_linter(
    settings: Settings, names: GateCacheNames, prefilter: bool, modules: RunModules
) -> Linter:
    from replaylint.lint.engine import Linter

    return Linter(settings, gate_caches=names, prefilter=prefilter, project=modules.index)


def _run_jobs(
    linter: Linter, jobs: list[_LintJob], sizes: list[int], workers: int
) -> list[FileReport]:
    if workers <= 1 or len(jobs) < 2 or sum(sizes) < _PARALLEL_MIN_BYTES or not can_fork():
        return [_lint_one(linter, job) for job in jobs]
    # Largest files first, one at a time: a few big files must not end up behind one worker.
    order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
    reports: list[FileReport | None] = [None] * len(jobs)
    for position, report in zip(
        order, in_workers(_lint_in_worker, linter, [jobs[i] for i in order], workers), strict=True
    ):
        reports[position] = report
    return [report for report in reports if report is not None]


def _stat_and_look_up(items: Sequence[Discovered], cache: ResultCache | None) -> dict[Path, _File]:
    """Every regular file of the run, with its cache entry when size and mtime still match."""
    cwd = os.getcwd()
    known: dict[Path, _File] = {}
    for item in items:
        name = str(item.path)
        status = _regular_file(name)
        if status is None:
            continue  # the analysis reports it
        info = _File(item, os.path.join(cwd, name), *status)
        if cache is not None:
            stored = cache.lookup(info.key)
            if stored is not None:
                info.stored = stored
                if _stamp(stored) == status:
                    info.digest, info.learned = stored.digest, stored.learned
        known[item.path] = info
    return known


def _stamp(entry: StoredFile) -> tuple[int, int, int]:
    return entry.size, entry.mtime_ns, entry.ctime_ns


def _unchanged(info: _File) -> bool:
    """Whether the cache's entry surely describes the file: same size, mtime and ctime. A tree
    restored with its mtimes has new ctimes, so its files are read and their digests compared."""
    stored = info.stored
    return stored is not None and _stamp(stored) == (info.size, info.mtime_ns, info.ctime_ns)


def _scan(scanner: _Scanner, files: list[_File], jobs: int, *, prepare_analysis: bool) -> None:
    """Scan ``files`` (their cache entries do not describe them), dropping unreadable ones.

    With ``prepare_analysis``, the analysis is imported meanwhile: a run that reads this many
    files will almost surely analyse some, and the import then costs no extra wall time.
    """
    if not files:
        return
    parallel = jobs > 1 and can_fork()
    needles = scanner.needles()
    if needles is not None and len(files) >= _SEARCH_MIN_FILES:
        from shutil import which

        from replaylint.lint.gatecache.grep import GrepSearch

        grep = which("grep")
        if grep is not None:
            search = GrepSearch(grep, [str(f.item.path) for f in files], needles, jobs)
            if prepare_analysis and not parallel:
                _import_analysis()
                prepare_analysis = False
            hits = search.result()
            for info in files:
                if str(info.item.path) not in hits:
                    # Names no needle: teaches nothing and cannot hold a finding.
                    info.scanned, info.stored, info.learned = True, None, ()
            files = [info for info in files if not info.scanned]
    if parallel and len(files) >= _PARALLEL_MIN_SCANS:
        scans = [(str(info.item.path), _stored_digest(info)) for info in files]
        chunk = max(1, len(scans) // (8 * jobs))  # small jobs: fewer round trips
        meanwhile = _import_analysis if prepare_analysis else None
        results = in_workers(_scan_in_worker, scanner, scans, jobs, chunk, meanwhile)
        for info, scanned in zip(files, results, strict=True):
            _apply(info, scanned)
        return
    for info in files:
        scanner.scan(info)


def _rescan_for_learned_names(
    scanner: _Scanner, files: list[_File], names: GateCacheNames, jobs: int
) -> None:
    """Learned names are needles too: look again at the files the first stage ruled out, and
    confirm again the ones the second stage ruled out."""
    from replaylint.lint.gatecache.grep import files_containing

    needles = [name.lower().encode() for name in names.learned]
    ruled_out = [f for f in files if not f.stage_one]
    if all(needle.isascii() for needle in needles):
        hits = files_containing([str(f.item.path) for f in ruled_out], needles, jobs)
    else:
        hits = {str(f.item.path) for f in ruled_out}
    for info in files:
        if info.candidate or not (info.stage_one or str(info.item.path) in hits):
            continue
        try:
            raw = info.item.path.read_bytes()
        except OSError:
            info.candidate = True  # let the analysis report it
            continue
        info.stage_one, info.candidate = _classify(scanner.relevance, raw)


def _rescan_for_model_casts(
    known: dict[Path, _File],
    linted: set[Path],
    modules: RunModules,
    names: GateCacheNames,
    jobs: int,
) -> None:
    """Files ruled out so far that may cast a model class holding a gate buffer are analysed
    (:mod:`replaylint.lint.run.model_classes`); nothing is read when no file read in this run
    names a gate cache."""
    naming = [info.item.path for info in known.values() if info.scanned and info.stage_one]
    if not naming:
        return
    others = [info.item.path for info in known.values() if info.scanned and not info.stage_one]
    from replaylint.lint.run.model_classes import model_casting_files

    def read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    for path in model_casting_files(modules.index, names, naming, others, jobs, read):
        if path in linted:
            known[path].candidate = True


def _merge_learned(
    items: Sequence[Discovered], known: dict[Path, _File], names: GateCacheNames
) -> dict[str, LearnedFrom]:
    """The names the run's files teach; the first file (in path order) that teaches one wins."""
    merged: dict[str, LearnedFrom] = {}
    for item in items:
        info = known.get(item.path)
        for name, row, function in info.learned if info is not None else ():
            if name not in merged and not names.matches(name):
                merged[name] = learned_from(str(item.path), row, function)
    return merged


def lint_many(
    settings: Settings,
    items: Sequence[Discovered],
    mode: Mode,
    *,
    unsafe: bool = False,
    cache: ResultCache | None = None,
    jobs: int = 1,
    prefilter: bool = True,
    keep_sources: bool = True,
    learn_from: Sequence[Discovered] = (),
) -> list[FileReport]:
    """Lint ``items``; reports in the order of ``items``.

    ``keep_sources=False`` leaves ``FileReport.source`` unset (only the text format shows source
    lines): a run over a large tree with many findings then does not hold the whole tree's text.
    ``learn_from`` are more files (the rest of the project) whose decode calls teach gate-cache
    names; they are read only when the cache does not know them, and not linted.
    """
    names = GateCacheNames(settings.gate_cache_patterns)
    scanner = _Scanner(settings, Relevance(names, settings.entry_points), digests=cache is not None)
    linted = {item.path for item in items}
    extra = [item for item in learn_from if item.path not in linted]
    teachers = sorted([*items, *extra], key=lambda item: str(item.path))
    known = _stat_and_look_up(teachers, cache)
    unseen = [info for info in known.values() if not _unchanged(info)]
    _scan(scanner, unseen, jobs, prepare_analysis=len(unseen) >= _SEARCH_MIN_FILES)
    for info in unseen:
        if not info.scanned:
            del known[info.item.path]  # unreadable: the analysis reports it

    merged = _merge_learned(teachers, known, names)
    readable = [str(item.path) for item in teachers if item.path in known]
    merged.update(learned_from_getters(readable, names, merged, jobs))
    stamps = []  # what the wrapper stage's cached result is keyed on
    if cache is not None:
        stamps = [(str(path), i.size, i.mtime_ns, i.ctime_ns) for path, i in known.items()]
    merged.update(wrapper_rings(settings, stamps, readable, names, merged, cache, jobs))
    if merged:
        names = names.with_learned(merged)
        scanner.relevance = Relevance(names, settings.entry_points)
        rescan = [f for f in known.values() if f.scanned and f.item.path in linted]
        _rescan_for_learned_names(scanner, rescan, names, jobs)

    def digests() -> dict[str, str]:
        return {os.path.abspath(i.key): i.digest for i in known.values() if i.digest}

    modules = RunModules([item.path for item in teachers], digests, cache)
    if prefilter:  # a file that loops over one of these names no gate cache
        needles = scanner.relevance.byte_needles

        def naming() -> list[str]:  # read in this run, and checked against the learned names
            return [str(p) for p, info in known.items() if info.stage_one]

        every_file_read = not extra and all(info.scanned for info in known.values())
        files = naming if every_file_read else readable
        tables = name_table_constants(files, needles, stamps, names, cache, jobs)
        modules.index.name_tables = tables
    learned_key = _learned_key(names, modules.index.name_tables)

    reports: dict[Path, FileReport] = {}
    to_lint: list[_LintJob] = []
    sizes: list[int] = []
    stale: list[_File] = []  # unchanged, but cached under other learned names
    for item in items:
        answerable = known.get(item.path)
        stored = answerable.stored if answerable is not None else None
        if answerable is None or stored is None:
            continue
        info = answerable
        if stored.learned_key == learned_key and modules.unchanged(stored.dependencies):
            report = _cached_report(info, stored, mode, unsafe, keep_sources)
            if report is not None:
                reports[item.path] = report
                if info.scanned and cache is not None and mode is not Mode.DIFF:
                    # Same content under a new mtime: remember the new one, skip the read next time.
                    cache.put(info.key, _entry(info, learned_key, report))
                continue
        if not info.scanned:
            stale.append(info)
    for info in stale:  # read them now, with this run's names
        if not scanner.scan(info):
            del known[info.item.path]
    if prefilter:
        _rescan_for_model_casts(known, linted, modules, names, jobs)
        waiting = [str(p) for p, info in known.items() if p in linted and not info.candidate]
        for path in files_reading(waiting, modules.index.name_tables, jobs):
            known[Path(path)].candidate = True

    for item in items:
        if item.path in reports:
            continue
        state = known.get(item.path)
        if state is not None and prefilter and not state.candidate:
            reports[item.path] = FileReport(str(item.path), unsafe_fixes=unsafe)
            if cache is not None and mode is not Mode.DIFF:
                cache.put(state.key, _entry(state, learned_key, None))
            continue
        to_lint.append((item, mode, unsafe, keep_sources))
        sizes.append(state.size if state is not None else 0)
    if to_lint:
        linter = _make_linter(settings, names, prefilter, modules)
        done = _run_jobs(linter, to_lint, sizes, jobs)
        for (item, *_), report in zip(to_lint, done, strict=True):
            reports[item.path] = report
            if cache is not None and mode is not Mode.DIFF:
                _remember(cache, settings, item, report, known.get(item.path), learned_key)
    if cache is not None:
        for item in extra:  # remember what the rest of the project teaches
            teacher = known.get(item.path)
            if (
                teacher is not None
                and teacher.scanned
                and teacher.stored is None
                and teacher.digest
            ):
                cache.put(teacher.key, _learned_entry(teacher))
        if mode is not Mode.DIFF:
            cache.save()
    return [reports[item.path] for item in items]


def _learned_entry(info: _File) -> CachedFile:
    """An entry for a file read only to learn from: its names, no results."""
    return CachedFile(info.size, info.mtime_ns, info.digest, info.learned, "", None, info.ctime_ns)


def _entry(info: _File, learned_key: str, report: FileReport | None) -> CachedFile:
    """An entry for results known without analysing (None: ruled out by the pre-filter)."""
    return CachedFile(
        info.size,
        info.mtime_ns,
        info.digest,
        info.learned,
        learned_key,
        () if report is None else tuple(report.findings),
        info.ctime_ns,
        () if report is None else report.dependencies,
    )


def _remember(
    cache: ResultCache,
    settings: Settings,
    item: Discovered,
    report: FileReport,
    info: _File | None,
    learned_key: str,
) -> None:
    if report.error is not None:
        return  # errors are rare and worded for this run's paths: lint such files again
    name = str(item.path)
    try:
        raw = item.path.read_bytes() if report.changed or info is None else None
        status = os.stat(name)
    except OSError:
        return
    key = info.key if info is not None else os.path.join(os.getcwd(), name)
    if raw is not None:  # fixed (or not seen before): describe the new content
        base = Relevance(GateCacheNames(settings.gate_cache_patterns), settings.entry_points)
        learned = _learn(settings, name, raw, _classify(base, raw)[1])
        content = digest(raw)
    else:
        assert info is not None
        if (info.size, info.mtime_ns, info.ctime_ns) != (
            status.st_size,
            status.st_mtime_ns,
            status.st_ctime_ns,
        ):
            return  # changed while we ran: do not vouch for it
        content, learned = info.digest, info.learned
    cache.put(
        key,
        CachedFile(
            size=status.st_size,
            mtime_ns=status.st_mtime_ns,
            digest=content,
            learned=learned,
            learned_key=learned_key,
            findings=tuple(report.findings),
            ctime_ns=status.st_ctime_ns,
            dependencies=report.dependencies,
        ),
    )
