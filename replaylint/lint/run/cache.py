"""The result cache: per-file results keyed by content, configuration and version.

``.replaylint_cache/`` (it ignores itself with its own ``.gitignore``) holds one JSON file per
effective configuration — the settings, the replaylint version and the rule set. Each file maps an
absolute path to its size, modification time, content digest, the gate-cache names it teaches and
its results under a given set of learned names (and, for a file that was analysed, the digests of
the project modules whose summaries it read: a change of a policy module re-lints its importers). A
file whose size and mtime are unchanged is not even read; one whose content digest is unchanged is
not analysed again. Entries are decoded one at a time, and their findings only when a run reports
them. Module summaries are kept by content digest, so an unchanged module is not parsed again.

Safety: the store is written to a temporary file and renamed into place, so a crash or a
concurrent run leaves either the old or the new store, never a torn one (the last writer wins).
A store or entry that does not have the expected shape is ignored, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaylint._version import __version__
from replaylint.lint.model import Applicability, Edit, Finding, Fix, Location

CACHE_DIRECTORY = ".replaylint_cache"
_FORMAT = 34
_MAX_SUMMARIES = 8192  # module summaries kept between runs (content digest -> summary)


def digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True)
class CachedFile:
    size: int
    mtime_ns: int
    digest: str
    """Content digest; "" when the file was ruled out without being read."""
    learned: tuple[tuple[str, int, str], ...]
    """(name, row, function) of every gate-cache name the file teaches."""
    learned_key: str
    """Fingerprint of the learned names the results were computed with."""
    findings: tuple[Finding, ...] | None
    """None when the file's results are unknown."""
    ctime_ns: int = 0
    """The inode's change time: restoring a tree with its mtimes (``cp -p``, ``rsync -a``,
    ``tar x``) changes it, and then the content digest decides."""
    dependencies: tuple[tuple[str, str], ...] = ()
    """(absolute path, content digest) of the project modules the results were computed from."""


@dataclass(frozen=True)
class StoredFile:
    """A store entry as read: its findings are decoded only when a run needs them."""

    size: int
    mtime_ns: int
    digest: str
    learned: tuple[tuple[str, int, str], ...]
    learned_key: str
    raw_findings: Any
    ctime_ns: int = 0
    dependencies: tuple[tuple[str, str], ...] = ()

    def findings(self, filename: str) -> tuple[Finding, ...] | None:
        """The cached findings, or None when unknown or not in the shape we write."""
        if self.raw_findings is None:
            return None
        try:
            return tuple(finding_from_data(item, filename) for item in self.raw_findings)
        except (TypeError, ValueError, KeyError, IndexError):
            return None


def _location(data: Any) -> Location:
    return Location(int(data[0]), int(data[1]))


def finding_to_data(finding: Finding) -> list[Any]:
    fix = finding.fix
    return [
        finding.code,
        finding.message,
        [finding.location.row, finding.location.column],
        [finding.end_location.row, finding.end_location.column],
        list(finding.statement_rows),
        None
        if fix is None
        else [
            fix.applicability.value,
            fix.message,
            [
                [
                    [e.location.row, e.location.column],
                    [e.end_location.row, e.end_location.column],
                    e.content,
                ]
                for e in fix.edits
            ],
        ],
    ]


def finding_from_data(data: Any, filename: str) -> Finding:
    code, message, start, end, rows, fix = data
    return Finding(
        code=str(code),
        message=str(message),
        filename=filename,
        location=_location(start),
        end_location=_location(end),
        fix=None
        if fix is None
        else Fix(
            Applicability(fix[0]),
            str(fix[1]),
            tuple(Edit(_location(a), _location(b), str(content)) for a, b, content in fix[2]),
        ),
        statement_rows=(int(rows[0]), int(rows[1])),
    )


class ResultCache:
    """Load once at the start of a run, update per file, save once at the end."""

    def __init__(self, root: Path, configuration_key: str) -> None:
        self.directory = root / CACHE_DIRECTORY
        key = hashlib.blake2b(
            f"{_FORMAT}|{__version__}|{configuration_key}".encode(), digest_size=12
        ).hexdigest()
        self.path = self.directory / f"results-{key}.json"
        self._entries: dict[str, list[Any]] = {}
        self._summaries: dict[str, Any] = {}
        self._used_summaries: set[str] = set()
        self._stages: dict[str, Any] = {}
        self._used_stages: dict[str, Any] = {}
        self._dirty = False
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return  # no store yet, or an unreadable one: start afresh
        if isinstance(data, dict) and isinstance(data.get("files"), dict):
            self._entries = data["files"]
            summaries = data.get("summaries")
            if isinstance(summaries, dict):
                self._summaries = summaries
            stages = data.get("stages")
            if isinstance(stages, dict):
                self._stages = stages

    def summary(self, content_digest: str) -> tuple[bool, Any]:
        """(whether the store has it, the module summary) of the file with ``content_digest``;
        a summary is plain JSON data (see :mod:`replaylint.lint.project.summaries`)."""
        if content_digest in self._summaries:
            self._used_summaries.add(content_digest)
            return True, self._summaries[content_digest]
        return False, None

    def put_summary(self, content_digest: str, summary: Any) -> None:
        self._summaries[content_digest] = summary
        self._used_summaries.add(content_digest)
        self._dirty = True

    def stage(self, key: str) -> tuple[bool, Any]:
        """(whether the store has it, the result) of a whole-project stage of the run whose
        inputs hash to ``key``; only the results a run looks up or stores are kept."""
        if key in self._stages:
            self._used_stages[key] = self._stages[key]
            return True, self._stages[key]
        return False, None

    def put_stage(self, key: str, result: Any) -> None:
        self._stages[key] = self._used_stages[key] = result
        self._dirty = True

    def lookup(self, key: str) -> StoredFile | None:
        """The entry of the file whose absolute path is ``key``; None if absent or malformed."""
        entry = self._entries.get(key)
        try:
            size, mtime_ns, content_digest, learned, learned_key, findings, ctime_ns, used = entry  # type: ignore[misc]
            if findings is not None and not isinstance(findings, list):
                return None
            return StoredFile(
                size=int(size),
                mtime_ns=int(mtime_ns),
                digest=str(content_digest),
                learned=tuple((str(n), int(r), str(f)) for n, r, f in learned),
                learned_key=str(learned_key),
                raw_findings=findings,
                ctime_ns=int(ctime_ns),
                dependencies=tuple((str(path), str(known)) for path, known in used),
            )
        except (TypeError, ValueError, KeyError, IndexError):
            return None  # absent, or not the shape we write: ignore it

    def put(self, key: str, cached: CachedFile) -> None:
        self._entries[key] = [
            cached.size,
            cached.mtime_ns,
            cached.digest,
            [list(item) for item in cached.learned],
            cached.learned_key,
            None if cached.findings is None else [finding_to_data(f) for f in cached.findings],
            cached.ctime_ns,
            [list(item) for item in cached.dependencies],
        ]
        self._dirty = True

    def save(self) -> None:
        """Write the store atomically; a cache that cannot be written is silently skipped."""
        if not self._dirty:
            return
        try:
            self.directory.mkdir(exist_ok=True)
            ignore = self.directory / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# Created by replaylint: the cache ignores itself.\n*\n")
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        except OSError:
            return
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                summaries = self._summaries
                if len(summaries) > _MAX_SUMMARIES:  # keep what this run read
                    summaries = {k: v for k, v in summaries.items() if k in self._used_summaries}
                json.dump(
                    {
                        "format": _FORMAT,
                        "files": self._entries,
                        "summaries": summaries,
                        "stages": self._used_stages,
                    },
                    stream,
                    separators=(",", ":"),
                )
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
