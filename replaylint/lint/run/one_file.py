"""One file through the linter: read, check or fix, write atomically, and report.

The engine (and with it libcst) is imported by the caller only when a text is really analysed: a
run answered from the result cache never pays for that import.
"""

from __future__ import annotations

import ast
import difflib
import os
from typing import TYPE_CHECKING

from replaylint.lint.model import FileReport, Mode, SourceError
from replaylint.lint.run.discovery import Discovered
from replaylint.lint.run.files import FileProblem, read_source, write_atomically

if TYPE_CHECKING:
    from replaylint.lint.engine import Linter


def _diff(filename: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{filename}",
            tofile=f"b/{filename}",
        )
    )


def _error(filename: str, error: SourceError) -> str:
    where = filename if error.row is None else f"{filename}:{error.row}:{error.column}"
    return f"{where}: {error.message}"


def _python_syntax_error(text: str) -> SourceError | None:
    """Python's own account of a syntax error: libcst's native parser reports column 1 and a
    list of expected tokens, Python the exact position and a readable reason."""
    try:
        ast.parse(text)
    except SyntaxError as error:
        if error.lineno is None:
            return None
        return SourceError(f"syntax error: {error.msg}", error.lineno, error.offset or 1)
    except (RecursionError, MemoryError, ValueError):
        return None
    return None  # only libcst rejects it: keep libcst's message


def lint_text(
    linter: Linter, text: str, filename: str, mode: Mode, *, unsafe: bool = False
) -> tuple[FileReport, str]:
    """Lint (and in fix/diff mode fix) ``text``; returns the report and the resulting text."""
    report = FileReport(filename, source=text, unsafe_fixes=unsafe)
    if linter.project is not None:
        linter.project.take_used()  # what the analysis of this text reads is recorded afresh
    try:
        report.notes.extend(linter.noqa_notes(text, filename))
        if mode is Mode.CHECK:
            report.findings = linter.check(text, filename)
            report.dependencies = _dependencies(linter, filename)
            return report, text
        result = linter.fix(text, filename, unsafe=unsafe)
        report.dependencies = _dependencies(linter, filename)
    except SourceError as error:
        if error.row is not None:  # a syntax error, not "nested too deeply"
            error = _python_syntax_error(text) or error
        report.error = _error(filename, error)
        return report, text
    except RecursionError:  # libcst's tree walks recurse per level (see syntax/limits.py)
        report.error = (
            f"{filename}: is too deeply nested to analyse (Python's recursion limit); "
            "replaylint skipped it"
        )
        return report, text
    except Exception as error:  # a bug in a rule must not stop the other files
        report.error = (
            f"{filename}: internal error while linting ({type(error).__name__}: {error}); "
            "please report this as a replaylint bug"
        )
        return report, text
    report.findings = list(result.remaining)
    report.fixed = result.applied
    report.source = result.source
    report.changed = result.source != text
    report.notes.extend(
        f"{filename}:{f.location.row}:{f.location.column}: the fix for {f.code} would make the "
        "file unparsable, so it was not applied (please report this as a replaylint bug)"
        for f in result.dropped
    )
    if mode is Mode.DIFF and report.changed:
        report.diff = _diff(filename, text, result.source)
    return report, result.source


def _dependencies(linter: Linter, filename: str) -> tuple[tuple[str, str], ...]:
    """The other project modules the analysis read, with their content digests."""
    if linter.project is None:
        return ()
    own = os.path.abspath(filename)
    return tuple(used for used in linter.project.take_used() if used[0] != own)


def _outside_root(item: Discovered) -> bool:
    """A symlink found by walking that points outside the folder it was found in."""
    if item.explicit or not item.path.is_symlink():
        return False
    try:
        item.path.resolve().relative_to(item.root.resolve())
    except ValueError:
        return True
    return False


def lint_file(linter: Linter, item: Discovered, mode: Mode, *, unsafe: bool = False) -> FileReport:
    filename = str(item.path)
    try:
        source = read_source(item.path)
    except FileProblem as problem:
        return FileReport(filename, error=f"{filename}: {problem}")
    report, fixed_text = lint_text(linter, source.text, filename, mode, unsafe=unsafe)
    if mode is not Mode.FIX or not report.changed:
        return report
    if _outside_root(item):
        report.notes.append(
            f"{filename}: not fixed: it is a symlink to a file outside {item.root}; "
            "name the file explicitly to fix it"
        )
    else:
        try:
            write_atomically(source, fixed_text)
            return report
        except FileProblem as problem:
            report.error = f"{filename}: {problem}"
    # Nothing was written: report the original findings, not the would-be fixed ones.
    report.findings = linter.check(source.text, filename)
    report.source = source.text
    report.fixed = 0
    report.changed = False
    return report
