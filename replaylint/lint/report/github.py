"""GitHub Actions workflow commands: one ``::error`` annotation per finding, and one per file
that could not be linted."""

from __future__ import annotations

from collections.abc import Sequence

from replaylint.lint.model import FileReport
from replaylint.lint.report.errors import parse_error


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(reports: Sequence[FileReport]) -> str:
    lines = []
    for report in reports:
        for f in report.findings:
            lines.append(
                f"::error file={_escape_property(f.filename)},line={f.location.row},"
                f"col={f.location.column},endLine={f.end_location.row},"
                f"endColumn={f.end_location.column},title={f.code}::{_escape_data(f.message)}\n"
            )
        error = parse_error(report)
        if error is not None:
            where = f"file={_escape_property(error.filename)}"
            if error.has_position:
                where += f",line={error.location.row},col={error.location.column}"
            lines.append(
                f"::error {where},title=replaylint could not lint this file::"
                f"{_escape_data(error.message)}\n"
            )
    return "".join(lines)
