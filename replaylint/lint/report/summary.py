"""The closing lines of a run (``Found 3 errors.``) and ``--statistics`` (counts per rule)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from replaylint.lint.model import FileReport, Mode
from replaylint.lint.rules.catalogue import RULE_NAMES


def render_statistics(reports: Sequence[FileReport], output_format: str) -> str:
    counts = Counter(f.code for r in reports for f in r.findings)
    fixable = {f.code for r in reports for f in r.findings if r.fixable(f)}
    rows = [
        {
            "code": code,
            "name": RULE_NAMES[code],
            "count": count,
            "fixable": code in fixable,
        }
        for code, count in sorted(counts.items())
    ]
    if output_format == "json":
        return json.dumps(rows, indent=2) + "\n"
    return "".join(
        f"{row['count']:>5}\t{row['code']}\t{'[*] ' if row['fixable'] else '    '}{row['name']}\n"
        for row in rows
    )


def _errors(count: int) -> str:
    return f"{count} error" if count == 1 else f"{count} errors"


def _hidden_fixes(count: int) -> str:
    fixes = "1 hidden fix" if count == 1 else f"{count} hidden fixes"
    return f"{fixes} can be enabled with the `--unsafe-fixes` option"


def render_fix_only_summary(reports: Sequence[FileReport], mode: Mode, unreadable: int) -> str:
    """``--fix-only``: what was fixed; what remains is not reported."""
    fixed = sum(r.fixed for r in reports)
    text = f"Fixed {_errors(fixed)}.\n" if fixed else "No errors fixed.\n"
    if unreadable:
        files = "1 file" if unreadable == 1 else f"{unreadable} files"
        text += f"{files} could not be checked (see the errors above).\n"
    return text


def render_summary(reports: Sequence[FileReport], mode: Mode, unreadable: int) -> str:
    remaining = sum(len(r.findings) for r in reports)
    fixed = sum(r.fixed for r in reports)
    fixable = sum(1 for r in reports for f in r.findings if r.fixable(f))
    hidden = sum(1 for r in reports for f in r.findings if f.fix is not None and not r.fixable(f))
    if mode is Mode.DIFF:
        changed = sum(1 for r in reports if r.changed)
        files = "1 file" if changed == 1 else f"{changed} files"
        return f"Would fix {_errors(fixed)} in {files}.\n" if changed else "No fixes to apply.\n"
    if remaining == 0 and fixed == 0:
        if unreadable:
            files = "1 file" if unreadable == 1 else f"{unreadable} files"
            return f"No findings, but {files} could not be checked (see the errors above).\n"
        return "All checks passed!\n"
    if mode is Mode.FIX:
        text = f"Found {_errors(remaining + fixed)} ({fixed} fixed, {remaining} remaining).\n"
    else:
        text = f"Found {_errors(remaining)}.\n"
        if fixable:
            text += f"[*] {fixable} fixable with the `--fix` option"
            text += f" ({_hidden_fixes(hidden)}).\n" if hidden else ".\n"
    if hidden and not (mode is Mode.CHECK and fixable):
        text += f"No fixes available ({_hidden_fixes(hidden)}).\n"
    return text
