"""Linting many files: the result cache, the learning pass, the pre-filter and the analysis.

A run looks at each file's size and modification time first: files the cache knows in that state
are not read at all. The others are scanned (:mod:`replaylint.lint.run.scanning`): a search of
the tree finds the few files that name a gate cache or a decode entry point, and only those are
read, to learn names and to confirm that they may hold a finding. With the learned names fixed,
every file whose cached results were computed with the same names is answered from the cache;
the rest are analysed (:mod:`replaylint.lint.run.analysis`) and the reports come back in path
order.

The analysis (libcst and the rules) is imported only when some file must be analysed, so a run
answered from the cache costs little more than start-up, discovery and one ``stat`` per file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.run.analysis import (
    EarlyAnalysis,
    LintJob,
    import_analysis,
    make_linter,
    run_jobs,
)
from replaylint.lint.run.cache import CachedFile, ResultCache, StoredFile, digest
from replaylint.lint.run.discovery import Discovered
from replaylint.lint.run.files import FileProblem, decode_source
from replaylint.lint.run.getters import learned_from_getters
from replaylint.lint.run.modules import RunModules
from replaylint.lint.run.name_tables import files_reading, name_table_constants
from replaylint.lint.run.scanning import (
    FileState,
    Scanner,
    classify,
    learn,
    rescan_for_learned_names,
    scan,
    stat_and_look_up,
    unchanged,
)
from replaylint.lint.run.taught import (
    learned_from,
    rows_of_learned_rings,
    taught_by,
    wrapper_rings,
)

# A run that reads this many files will almost surely analyse some: the analysis is imported
# while they are searched.
_PREPARE_MIN_FILES = 64


def _learned_key(names: GateCacheNames, tables: frozenset[str]) -> str:
    learned = sorted(
        (name, origin.filename, origin.row, taught_by(origin))
        for name, origin in names.learned.items()
    )
    return hashlib.blake2b(repr((learned, sorted(tables))).encode(), digest_size=12).hexdigest()


def _cached_report(
    info: FileState, stored: StoredFile, mode: Mode, unsafe: bool, keep_sources: bool
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


def _rescan_for_model_casts(
    known: dict[Path, FileState],
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


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _last_prefilter_stages(
    known: dict[Path, FileState],
    linted: set[Path],
    modules: RunModules,
    names: GateCacheNames,
    jobs: int,
) -> None:
    """The files the analysis must see although they name no gate cache: those that may cast a
    model holding a gate buffer, and those that read a name table."""
    _rescan_for_model_casts(known, linted, modules, names, jobs)
    if modules.index.record_names is None and all(info.scanned for info in known.values()):
        from replaylint.lint.run.record_classes import record_class_names

        scanned = [info.item.path for info in known.values()]
        modules.index.record_names = record_class_names(scanned, jobs, _read_bytes)
    waiting = [str(p) for p, info in known.items() if p in linted and not info.candidate]
    for path in files_reading(waiting, modules.index.name_tables, jobs):
        known[Path(path)].candidate = True


def _merge_learned(
    items: Sequence[Discovered], known: dict[Path, FileState], names: GateCacheNames
) -> dict[str, LearnedFrom]:
    """The names the run's files teach; the first file (in path order) that teaches one wins,
    unless it only guessed it from its neighbours and a later one saw it passed to the kernel."""
    merged: dict[str, LearnedFrom] = {}
    for item in items:
        info = known.get(item.path)
        for name, row, function in info.learned if info is not None else ():
            if names.matches(name):
                continue
            origin = learned_from(str(item.path), row, function)
            if origin.outranks(merged.get(name)):
                merged[name] = origin
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
    scanner = Scanner(settings, Relevance(names, settings.entry_points), digests=cache is not None)
    linted = {item.path for item in items}
    extra = [item for item in learn_from if item.path not in linted]
    teachers = sorted([*items, *extra], key=lambda item: str(item.path))
    known = stat_and_look_up(teachers, cache)
    unseen = [info for info in known.values() if not unchanged(info)]
    scan(
        scanner,
        unseen,
        jobs,
        meanwhile=import_analysis if len(unseen) >= _PREPARE_MIN_FILES else None,
    )
    for info in unseen:
        if not info.scanned:
            del known[info.item.path]  # unreadable: the analysis reports it

    merged = _merge_learned(teachers, known, names)
    readable = [str(item.path) for item in teachers if item.path in known]
    merged.update(learned_from_getters(readable, names, merged, jobs))
    stamps = []  # what the wrapper stage's cached result is keyed on
    if cache is not None:
        stamps = [(str(path), i.size, i.mtime_ns, i.ctime_ns) for path, i in known.items()]
    # Every file searched in this run: the ones read hold every entry point's text there is.
    every_file_scanned = all(info.scanned for info in known.values())
    every_file_read = not extra and every_file_scanned
    kernel_callers = [str(p) for p, i in known.items() if i.read] if every_file_scanned else None

    def digests() -> dict[str, str]:
        return {os.path.abspath(i.key): i.digest for i in known.values() if i.digest}

    def as_read() -> frozenset[str]:  # the scan's name tables, found with the initial names
        return frozenset().union(*(i.tables for i in known.values() if i.stage_one))

    modules = RunModules([item.path for item in teachers], digests, cache)
    early, prefiltered = None, False
    if prefilter and every_file_read and not merged:
        # The names so far are the run's unless the wrapper stage teaches one: the files that
        # surely need the analysis can start it on the other cores meanwhile.
        modules.index.name_tables = as_read()
        _last_prefilter_stages(known, linted, modules, names, jobs)
        prefiltered = True
        sure = [known[i.path] for i in items if i.path in known and known[i.path].candidate]
        sure = [info for info in sure if info.stored is None]
        early = EarlyAnalysis.start(
            make_linter(settings, names, prefilter, modules),
            [(info.item, mode, unsafe, keep_sources) for info in sure],
            [info.size for info in sure],
            jobs,
        )
    try:
        merged.update(
            wrapper_rings(settings, stamps, readable, names, merged, cache, jobs, kernel_callers)
        )
        merged.update(rows_of_learned_rings(settings, stamps, readable, names, merged, cache, jobs))
    except BaseException:
        if early is not None:
            early.reports(valid=False)
        raise
    if merged:
        names = names.with_learned(merged)
        scanner.relevance = Relevance(names, settings.entry_points)
        rescan = [f for f in known.values() if f.scanned and f.item.path in linted]
        rescan_for_learned_names(scanner, rescan, names, jobs)
    analysed_early = early.reports(valid=not merged) if early is not None else {}

    if prefilter:  # a file that loops over one of these names no gate cache
        needles = scanner.relevance.byte_needles

        def naming() -> list[str]:  # read in this run, and checked against the learned names
            return [str(p) for p, info in known.items() if info.stage_one]

        files = naming if every_file_read else readable
        found = as_read if every_file_read and not merged else None
        tables = name_table_constants(files, needles, stamps, names, cache, jobs, found)
        modules.index.name_tables = tables
    learned_key = _learned_key(names, modules.index.name_tables)

    reports: dict[Path, FileReport] = {}
    to_lint: list[LintJob] = []
    sizes: list[int] = []
    stale: list[FileState] = []  # unchanged, but cached under other learned names
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
    if prefilter and not (prefiltered and not merged):
        _last_prefilter_stages(known, linted, modules, names, jobs)

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
        rest = [i for i, (item, *_) in enumerate(to_lint) if item.path not in analysed_early]
        linter = make_linter(settings, names, prefilter, modules)
        done_now = iter(
            run_jobs(linter, [to_lint[i] for i in rest], [sizes[i] for i in rest], jobs)
        )
        done = [
            analysed_early[item.path] if item.path in analysed_early else next(done_now)
            for item, *_ in to_lint
        ]
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


def _learned_entry(info: FileState) -> CachedFile:
    """An entry for a file read only to learn from: its names, no results."""
    return CachedFile(info.size, info.mtime_ns, info.digest, info.learned, "", None, info.ctime_ns)


def _entry(info: FileState, learned_key: str, report: FileReport | None) -> CachedFile:
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
    info: FileState | None,
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
        learned = learn(settings, name, raw, classify(base, raw)[1])
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
