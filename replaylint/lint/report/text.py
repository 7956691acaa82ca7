"""Human-readable output, in ruff's style: a location line, the source snippet, the fix.

``colour=True`` adds ANSI colours (the command line decides: a terminal, ``--color``,
``NO_COLOR``); the text is otherwise identical.
"""

from __future__ import annotations

from collections.abc import Sequence

from replaylint.lint.model import FileReport, Finding, LineIndex

_BOLD, _RED, _CYAN, _BLUE, _RESET = "\x1b[1m", "\x1b[31m", "\x1b[36m", "\x1b[34m", "\x1b[0m"


class _Paint:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, *styles: str) -> str:
        return f"{''.join(styles)}{text}{_RESET}" if self.colour and text else text


def _headline(finding: Finding, fixable: bool, paint: _Paint) -> str:
    marker = f" {paint('[*]', _CYAN)}" if fixable else ""
    where = f"{finding.filename}:{finding.location.row}:{finding.location.column}:"
    return f"{paint(where, _BOLD)} {paint(finding.code, _BOLD, _RED)}{marker} {finding.message}"


def _snippet(finding: Finding, index: LineIndex, paint: _Paint) -> list[str]:
    row = finding.location.row
    if row > len(index.starts):
        return []
    line = index.line(row).expandtabs(1)
    start = finding.location.column - 1
    end = finding.end_location.column - 1 if finding.end_location.row == row else len(line)
    width = len(str(row))
    gutter = " " * width
    bar = paint("|", _BLUE)
    caret = " " * start + paint("^" * max(1, end - start) + " " + finding.code, _RED)
    lines = [
        f"{gutter} {bar}",
        f"{paint(str(row), _BLUE)} {bar} {line}",
        f"{gutter} {bar} {caret}",
        f"{gutter} {bar}",
    ]
    if finding.fix is not None:
        lines.append(
            f"{gutter} {paint('=', _BLUE)} {paint('help', _BOLD, _CYAN)}: {finding.fix.message}"
        )
    return lines


def render_text(reports: Sequence[FileReport], *, colour: bool = False) -> str:
    paint = _Paint(colour)
    out: list[str] = []
    for report in reports:
        index = LineIndex(report.source) if report.source is not None else None
        for finding in report.findings:
            out.append(_headline(finding, report.fixable(finding), paint))
            if index is not None:
                out.extend(_snippet(finding, index, paint))
            out.append("")  # a blank line after each finding, before the summary too
    return "".join(line + "\n" for line in out)


def render_concise(reports: Sequence[FileReport], *, colour: bool = False) -> str:
    paint = _Paint(colour)
    return "".join(
        _headline(f, report.fixable(f), paint) + "\n" for report in reports for f in report.findings
    )
