"""GitHub Actions workflow commands: one ``::error`` annotation per finding."""

from __future__ import annotations

from collections.abc import Sequence

from replaylint.lint.model import FileReport


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
    return "".join(lines)
