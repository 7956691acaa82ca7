"""The value types passed between the linter's layers; no libcst, no torch.

Locations, edits, fixes and findings mirror ruff's JSON model, so that editors and CI tooling that
read ruff's output can read ours. :class:`FileReport` is what running the linter over one file
produces and every reporter reads; :class:`SourceError` is a text that cannot be linted.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class Applicability(str, enum.Enum):
    """Whether a fix may be applied without the user's explicit consent."""

    SAFE = "safe"
    """Keeps the program's meaning apart from the dtype the rule is about."""
    UNSAFE = "unsafe"
    """May change behaviour elsewhere; applied only with ``--unsafe-fixes``."""


@dataclass(frozen=True, order=True)
class Location:
    """A position in a file: 1-based row, 1-based column counted in characters."""

    row: int
    column: int


@dataclass(frozen=True, order=True)
class Edit:
    """Replace the text between ``location`` (inclusive) and ``end_location`` with ``content``."""

    location: Location
    end_location: Location
    content: str


@dataclass(frozen=True)
class Fix:
    """A set of edits that together repair one finding."""

    applicability: Applicability
    message: str
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Finding:
    """One diagnostic: ``code`` at ``location`` in ``filename``."""

    code: str
    message: str
    filename: str
    location: Location
    end_location: Location
    fix: Fix | None = None
    # Rows of the statement the finding belongs to: a noqa comment on any of them suppresses it.
    statement_rows: tuple[int, int] = field(default=(0, 0), compare=False, repr=False)

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.filename, self.location.row, self.location.column, self.code)


# The line breaks Python's tokenizer (and libcst) recognise; str.splitlines knows more.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class LineIndex:
    """Converts between (row, column) locations and string offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0] + [match.end() for match in _LINE_BREAK.finditer(source)]

    def offset(self, location: Location) -> int:
        row = min(max(location.row, 1), len(self.starts))
        return min(self.starts[row - 1] + location.column - 1, len(self.source))

    def line(self, row: int) -> str:
        """Row ``row`` without its line break."""
        start = self.starts[row - 1]
        end = self.starts[row] if row < len(self.starts) else len(self.source)
        return self.source[start:end].rstrip("\r\n")

    def end(self) -> Location:
        """The location just past the last character."""
        return Location(len(self.starts), len(self.source) - self.starts[-1] + 1)


def newline_of(source: str) -> str:
    """The file's first line break, so that inserted lines match it (CRLF stays CRLF)."""
    match = _LINE_BREAK.search(source)
    return match.group() if match else "\n"


class Mode(enum.Enum):
    """What a run does to each file: report, fix in place, or show the fix as a diff."""

    CHECK = "check"
    FIX = "fix"
    DIFF = "diff"


@dataclass
class FileReport:
    """What happened to one file."""

    filename: str
    findings: list[Finding] = field(default_factory=list)
    """Findings that remain (after fixing, in fix mode)."""
    fixed: int = 0
    error: str | None = None
    """Why the file could not be linted, as ``path[:row:col]: message``; exit code 2."""
    notes: list[str] = field(default_factory=list)
    """Warnings that do not change the exit code on their own (fix not written, ...)."""
    diff: str = ""
    source: str | None = None
    """The text the findings refer to (for snippets)."""
    changed: bool = False
    unsafe_fixes: bool = False
    """Whether unsafe fixes were enabled: only then does an unsafe fix make a finding fixable."""
    dependencies: tuple[tuple[str, str], ...] = ()
    """(absolute path, content digest) of the other modules of the project whose summaries the
    analysis read: the findings hold while those files are unchanged."""

    def fixable(self, finding: Finding) -> bool:
        """Would ``--fix`` (with this run's ``--unsafe-fixes`` setting) fix ``finding``?"""
        fix = finding.fix
        return fix is not None and (self.unsafe_fixes or fix.applicability is Applicability.SAFE)


class SourceError(Exception):
    """A file that cannot be linted: its text is not Python we can parse."""

    def __init__(self, message: str, row: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.row = row
        self.column = column
