"""The value types the engine produces: locations, edits, fixes and findings.

They mirror ruff's JSON model so that editors and CI tooling that read ruff's output can read ours.
"""

from __future__ import annotations

import enum
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
    # Rows of the statement the finding belongs to: a ``# noqa`` on any of them suppresses it.
    statement_rows: tuple[int, int] = field(default=(0, 0), compare=False, repr=False)

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.filename, self.location.row, self.location.column, self.code)
