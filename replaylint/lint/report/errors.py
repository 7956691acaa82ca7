"""Files that could not be linted, as the machine-readable formats report them.

A :class:`~replaylint.lint.model.FileReport` names its problem as ``path[:row:col]: message``;
:func:`file_errors` splits that into a location and a message, so that every format can show the
file as ruff's formats show a syntax error: at its position, or at 1:1 when there is none (a file
that could not be read).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from replaylint.lint.model import FileReport, Location

_POSITION = re.compile(r":(\d+):(\d+)$")


@dataclass(frozen=True)
class FileError:
    """Why ``filename`` was not linted, and where in it, when the reason has a position."""

    filename: str
    message: str
    location: Location
    has_position: bool


def parse_error(report: FileReport) -> FileError | None:
    """The error of ``report`` (None if it was linted)."""
    error = report.error
    if error is None:
        return None
    prefix = f"{report.filename}"
    rest = error[len(prefix) :] if error.startswith(prefix) else ": " + error
    where, separator, message = rest.partition(": ")
    if not separator:
        return FileError(report.filename, error, Location(1, 1), False)
    match = _POSITION.fullmatch(where)
    if match is not None:
        row, column = int(match.group(1)), int(match.group(2))
        return FileError(report.filename, message, Location(row, column), True)
    if where:  # not our `path:row:col` shape: keep the whole text
        return FileError(report.filename, error, Location(1, 1), False)
    return FileError(report.filename, message, Location(1, 1), False)


def file_errors(reports: Sequence[FileReport]) -> Iterator[FileError]:
    """The errors of ``reports``, in their order."""
    for report in reports:
        error = parse_error(report)
        if error is not None:
            yield error
