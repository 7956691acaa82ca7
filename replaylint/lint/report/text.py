"""Human-readable output, in ruff's style: a location line, the source snippet, the fix."""

from __future__ import annotations

from collections.abc import Sequence

from replaylint.lint.model import FileReport, Finding, LineIndex


def _headline(finding: Finding, fixable: bool) -> str:
    marker = " [*]" if fixable else ""
    return (
        f"{finding.filename}:{finding.location.row}:{finding.location.column}: "
        f"{finding.code}{marker} {finding.message}"
    )


def _snippet(finding: Finding, index: LineIndex) -> list[str]:
    row = finding.location.row
    if row > len(index.starts):
        return []
    line = index.line(row).expandtabs(1)
    start = finding.location.column - 1
    end = finding.end_location.column - 1 if finding.end_location.row == row else len(line)
    width = len(str(row))
    gutter = " " * width
    caret = " " * start + "^" * max(1, end - start)
    lines = [f"{gutter} |", f"{row} | {line}", f"{gutter} | {caret} {finding.code}", f"{gutter} |"]
    if finding.fix is not None:
        lines.append(f"{gutter} = help: {finding.fix.message}")
    return lines


def render_text(reports: Sequence[FileReport]) -> str:
    out: list[str] = []
    for report in reports:
        index = LineIndex(report.source) if report.source is not None else None
        for finding in report.findings:
            out.append(_headline(finding, report.fixable(finding)))
            if index is not None:
                out.extend(_snippet(finding, index))
            out.append("")  # a blank line after each finding, before the summary too
    return "".join(line + "\n" for line in out)


def render_concise(reports: Sequence[FileReport]) -> str:
    return "".join(
        _headline(f, report.fixable(f)) + "\n" for report in reports for f in report.findings
    )
