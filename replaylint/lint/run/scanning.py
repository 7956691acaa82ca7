"""Reading the files that may matter, once per run: one ``grep`` per core finds the few files
that name a gate cache or a decode entry point (:mod:`replaylint.lint.gatecache.grep`), and only
those are read, to learn the gate-cache names their decode calls teach, to confirm word by word
that they may hold a finding, and to find the name tables they define."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.learning import (
    entry_point_needles,
    learn_gate_cache_names,
    learn_rings_by_order,
    learning_needles,
    parsed,
)
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.gatecache.ring_order import may_list_rings
from replaylint.lint.run.cache import ResultCache, StoredFile, digest
from replaylint.lint.run.discovery import Discovered
from replaylint.lint.run.files import FileProblem, decode_source
from replaylint.lint.run.name_tables import tables_in
from replaylint.lint.run.taught import taught_by
from replaylint.lint.run.workers import can_fork, in_workers, worker_state

__all__ = [
    "FileState",
    "Learned",
    "Scanner",
    "classify",
    "learn",
    "rescan_for_learned_names",
    "scan",
    "stat_and_look_up",
    "unchanged",
]

# Scanning more files than this starts with grep over all of them (gatecache/grep.py).
_SEARCH_MIN_FILES = 64
# Reading and classifying more files than this is spread over worker processes.
_PARALLEL_MIN_SCANS = 32

Learned = tuple[tuple[str, int, str], ...]


@dataclass
class FileState:
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
    learned: Learned = ()
    stage_one: bool = False
    """The file's bytes contain a pre-filter needle (so it may need analysing)."""
    candidate: bool = False
    """The pre-filter could not rule a finding out: the file must be analysed."""
    scanned: bool = False
    """Read (or ruled out by the tree search) in this run."""
    read: bool = False
    """Read in this run (not ruled out by the tree search)."""
    tables: frozenset[str] = frozenset()
    """The name tables it defines, found as it was read (for a file that passes stage one)."""


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


def learn(settings: Settings, filename: str, raw: bytes, relevant: bool) -> Learned:
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
        tree = parsed(text, filename)
        learned = {} if tree is None else learn_rings_by_order(tree, filename, base)
    else:
        learned = learn_gate_cache_names([(filename, text)], settings.entry_points, base)
    return tuple((name, origin.row, taught_by(origin)) for name, origin in learned.items())


def classify(relevance: Relevance, raw: bytes) -> tuple[bool, bool]:
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
    learned: Learned | None
    """None: the content is the cache entry's, and so are the names it teaches."""
    stage_one: bool
    candidate: bool
    tables: frozenset[str]
    """The name tables of a file that passes stage one, as the names the scanner began with
    list them."""


class Scanner:
    """Reads files that may matter: learning, content digests and the pre-filter."""

    def __init__(self, settings: Settings, relevance: Relevance, *, digests: bool) -> None:
        self.settings = settings
        self.relevance = relevance
        self.digests = digests
        self.initial_names = relevance.gate_caches

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
        stage_one, candidate = classify(self.relevance, raw)
        return _Scanned(
            digest=content,
            learned=None if same else learn(self.settings, path, raw, candidate),
            stage_one=stage_one,
            candidate=candidate,
            tables=frozenset(tables_in(raw, self.initial_names)) if stage_one else frozenset(),
        )

    def scan(self, info: FileState) -> bool:
        """Read and classify ``info``'s file in this process."""
        return _apply(info, self.read(str(info.item.path), _stored_digest(info)))


def _stored_digest(info: FileState) -> str:
    return info.stored.digest if info.stored is not None else ""


def _apply(info: FileState, scanned: _Scanned | None) -> bool:
    if scanned is None:
        return False
    info.scanned = info.read = True
    info.digest = scanned.digest
    info.tables = scanned.tables
    if scanned.learned is None:
        assert info.stored is not None
        info.learned = info.stored.learned
    else:
        info.stored, info.learned = None, scanned.learned  # new content: the entry is stale
    info.stage_one, info.candidate = scanned.stage_one, scanned.candidate
    return True


def _scan_in_worker(job: tuple[str, str]) -> _Scanned | None:
    state = worker_state()
    assert isinstance(state, Scanner)
    return state.read(*job)


def stat_and_look_up(
    items: Sequence[Discovered], cache: ResultCache | None
) -> dict[Path, FileState]:
    """Every regular file of the run, with its cache entry when size and mtime still match."""
    cwd = os.getcwd()
    known: dict[Path, FileState] = {}
    for item in items:
        name = str(item.path)
        status = _regular_file(name)
        if status is None:
            continue  # the analysis reports it
        info = FileState(item, os.path.join(cwd, name), *status)
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


def unchanged(info: FileState) -> bool:
    """Whether the cache's entry surely describes the file: same size, mtime and ctime. A tree
    restored with its mtimes has new ctimes, so its files are read and their digests compared."""
    stored = info.stored
    return stored is not None and _stamp(stored) == (info.size, info.mtime_ns, info.ctime_ns)


def scan(
    scanner: Scanner,
    files: list[FileState],
    jobs: int,
    *,
    meanwhile: Callable[[], object] | None = None,
) -> None:
    """Scan ``files`` (their cache entries do not describe them), dropping unreadable ones.

    ``meanwhile`` runs while the files are searched (the caller imports the analysis: a run that
    reads this many files will almost surely analyse some, and the import then costs no extra
    wall time).
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
            if meanwhile is not None and not parallel:
                meanwhile()
                meanwhile = None
            hits = search.result()
            for info in files:
                if str(info.item.path) not in hits:
                    # Names no needle: teaches nothing and cannot hold a finding.
                    info.scanned, info.stored, info.learned = True, None, ()
            files = [info for info in files if not info.scanned]
    if parallel and len(files) >= _PARALLEL_MIN_SCANS:
        scans = [(str(info.item.path), _stored_digest(info)) for info in files]
        chunk = max(1, len(scans) // (8 * jobs))  # small jobs: fewer round trips
        results = in_workers(_scan_in_worker, scanner, scans, jobs, chunk, meanwhile)
        for info, scanned in zip(files, results, strict=True):
            _apply(info, scanned)
        return
    for info in files:
        scanner.scan(info)


def rescan_for_learned_names(
    scanner: Scanner, files: list[FileState], names: GateCacheNames, jobs: int
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
        info.stage_one, info.candidate = classify(scanner.relevance, raw)
