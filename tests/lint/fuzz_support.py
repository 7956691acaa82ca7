"""The properties the fuzz tests check, as plain functions: the fuzz tests call them on generated
programs and the regression tests on the failing examples the fuzzing found.

Each check goes through the public API (:class:`~replaylint.lint.engine.Linter` and
:func:`~replaylint.lint.run.one_file.lint_text`) and raises ``AssertionError`` with the evidence.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import os
import re
import signal
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import ParamSpec, TypeVar

import libcst as cst
from hypothesis import HealthCheck, settings

from replaylint.lint.engine import Linter
from replaylint.lint.model import Applicability, Finding, Mode, SourceError
from replaylint.lint.run.one_file import lint_text

__all__ = [
    "EXAMPLE_TIME_LIMIT_S",
    "FILENAME",
    "ExampleTimeout",
    "assert_check_properties",
    "assert_fix_properties",
    "assert_prefilter_hides_nothing",
    "changes_outside",
    "fuzz_examples",
    "fuzz_settings",
    "python_compiles",
    "time_limit",
]

FILENAME = "fuzzed.py"
P = ParamSpec("P")
R = TypeVar("R")

# CI runs a fixed, small number of examples per test, derandomized (the same programs every run,
# so CI is never flaky) and without an example database. REPLAYLINT_FUZZ_EXAMPLES=<n> scales every
# fuzz test to n examples of its main strategy, randomized: the deep mode.
_DEEP = os.environ.get("REPLAYLINT_FUZZ_EXAMPLES", "").strip()


def fuzz_examples(ci_examples: int, deep_share: float = 1.0) -> int:
    """How many examples a test runs: ``ci_examples`` in CI; in deep mode the env variable's
    value times ``deep_share`` (for tests whose examples are much dearer than the others')."""
    if not _DEEP:
        return ci_examples
    try:
        deep = int(_DEEP)
    except ValueError:
        raise ValueError(
            f"REPLAYLINT_FUZZ_EXAMPLES must be a whole number of examples, got {_DEEP!r}"
        ) from None
    if deep < 1:
        raise ValueError(f"REPLAYLINT_FUZZ_EXAMPLES must be at least 1, got {deep}")
    return max(1, round(deep * deep_share))


def fuzz_settings(ci_examples: int, deep_share: float = 1.0) -> settings:
    """Hypothesis settings of one fuzz test: bounded and deterministic in CI, deep on request."""
    return settings(
        max_examples=fuzz_examples(ci_examples, deep_share),
        deadline=None,
        derandomize=not _DEEP,
        database=None,
        print_blob=bool(_DEEP),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


# One example must never hang the suite (an endless loop is a finding too): each check is
# interrupted after this many seconds where the platform allows it (Unix, main thread).
EXAMPLE_TIME_LIMIT_S = 20.0


class ExampleTimeout(Exception):
    """Linting one generated program took longer than :data:`EXAMPLE_TIME_LIMIT_S`."""


@contextlib.contextmanager
def time_limit(seconds: float = EXAMPLE_TIME_LIMIT_S) -> Iterator[None]:
    """Raise :class:`ExampleTimeout` inside the block once ``seconds`` have passed."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise ExampleTimeout(f"linting one program took more than {seconds:.0f} s (a hang?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _bounded(check: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(check)
    def bounded(*args: P.args, **kwargs: P.kwargs) -> R:
        with time_limit():
            return check(*args, **kwargs)

    return bounded


def python_compiles(source: str) -> bool:
    """Whether CPython compiles ``source``: a full compile, since the parser alone accepts a
    misplaced ``from __future__ import``, ``return`` outside a function and the like."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning for `1()` and friends
        try:
            compile(source, FILENAME, "exec", dont_inherit=True)
        except SyntaxError:
            return False
    return True


def _check(linter: Linter, source: str) -> list[Finding] | SourceError:
    try:
        return linter.check(source, FILENAME)
    except SourceError as error:
        return error


@_bounded
def assert_check_properties(source: str) -> list[Finding] | None:
    """Linting never raises: the engine raises nothing but :class:`SourceError`, the runner turns
    that into a reported error naming the file, and never reports an internal error.

    Returns the findings (None when the text is not something the linter can read).
    """
    linter = Linter()
    linter.learn([(FILENAME, source)])
    outcome = _check(linter, source)  # anything but SourceError propagates: a bug
    report, text = lint_text(linter, source, FILENAME, Mode.CHECK)
    assert text == source
    if isinstance(outcome, SourceError):
        assert report.error is not None
        assert report.error.startswith(FILENAME), report.error
        assert "internal error" not in report.error, report.error
        # Python accepts it, so it must be a limit (nesting), not a syntax error libcst invents.
        assert outcome.row is None or not python_compiles(source), (
            f"libcst rejects a program Python accepts: {outcome.message}"
        )
        return None
    assert report.error is None, report.error
    assert report.findings == outcome
    return outcome


@_bounded
def assert_prefilter_hides_nothing(source: str) -> None:
    """The pre-filter (both stages) never hides a finding the full analysis reports."""
    full, filtered = Linter(prefilter=False), Linter(prefilter=True)
    for linter in (full, filtered):
        linter.learn([(FILENAME, source)])
    expected = _check(full, source)
    if isinstance(expected, SourceError):
        return  # unreadable: the pre-filter may skip what the analysis cannot read
    assert _check(filtered, source) == expected
    if expected:
        assert filtered.relevance.may_hold_finding(source)
        for encoding in ("utf-8", "utf-8-sig"):
            assert filtered.relevance.may_hold_finding_raw(source.encode(encoding)), encoding


_IMPORT_LINE = re.compile(r"import \w+(?:\.\w+)*\Z")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_INLINE_IMPORT = re.compile(r"import \w+(?:\.\w+)*; ")


def _lines(source: str) -> list[str]:
    """Rows as Python's tokenizer (and the findings' locations) count them, breaks included."""
    starts = [0] + [match.end() for match in _LINE_BREAK.finditer(source)]
    ends = [*starts[1:], len(source)]
    return [source[start:end] for start, end in zip(starts, ends, strict=True) if start < end]


def _statement_spans(source: str) -> list[tuple[int, int]]:
    """Rows of every statement; a compound statement's span is its header only."""
    spans: list[tuple[int, int]] = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return spans  # libcst reads it, Python does not: only the findings' own rows count
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            spans.append((node.lineno, max(node.lineno, body[0].lineno - 1)))
        else:
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def _statement_rows_at(spans: list[tuple[int, int]], row: int) -> range:
    holding = [(last - first, first, last) for first, last in spans if first <= row <= last]
    if not holding:
        return range(row, row + 1)
    _, first, last = min(holding)
    return range(first, last + 1)


def _fixed_rows(source: str, findings: Iterable[Finding], allowed: set[Applicability]) -> set[int]:
    """Rows a fix may change: its finding's statement, and the statement each of its edits is in
    (a fix may cast where a local becomes the gate cache, not where it was allocated)."""
    spans = _statement_spans(source)
    rows: set[int] = set()
    for finding in findings:
        if finding.fix is not None and finding.fix.applicability in allowed:
            first, last = finding.statement_rows
            assert 1 <= first <= finding.location.row <= last, finding
            rows.update(range(first, last + 1))
            for edit in finding.fix.edits:
                if not _IMPORT_LINE.match(edit.content.strip()):
                    rows.update(_statement_rows_at(spans, edit.location.row))
                    rows.update(_statement_rows_at(spans, edit.end_location.row))
    return rows


def _gained_only_an_import(old: str, new: str) -> bool:
    return any(
        new[: match.start()] + new[match.end() :] == old for match in _INLINE_IMPORT.finditer(new)
    )


def changes_outside(before: str, after: str, rows: set[int]) -> list[str]:
    """What changed between ``before`` and ``after`` outside the 1-based ``rows`` of ``before``,
    besides added ``import x`` lines: one description per offending change."""
    old, new = _lines(before), _lines(after)
    problems: list[str] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        touched = set(range(i1 + 1, i2 + 1))  # 1-based rows of `before` replaced or deleted
        if tag == "replace" and i2 - i1 == j2 - j1:
            # A row that only gained `import x; ` (after a `from __future__` import on it) is fine.
            touched = {
                row
                for row, line in zip(range(i1 + 1, i2 + 1), new[j1:j2], strict=True)
                if not _gained_only_an_import(old[row - 1], line)
            }
        if not touched <= rows:
            problems.append(
                f"{tag} rows {sorted(touched - rows)}: {old[i1:i2]!r} -> {new[j1:j2]!r}"
            )
            continue
        if tag == "insert" or j2 - j1 > i2 - i1:
            added = [line for line in new[j1:j2] if line not in old[i1:i2]]
            beside = {i1, i1 + 1} & rows or touched
            if not beside and not all(_IMPORT_LINE.match(line.strip()) for line in added):
                problems.append(f"insert before row {i1 + 1}: {added!r}")
    return problems


@_bounded
def assert_fix_properties(source: str, *, unsafe: bool = False) -> str | None:
    """``--fix`` output parses (ast and libcst), fixing is idempotent, changes nothing outside the
    statements of the findings it fixed, keeps CRLF/CR line endings and leaves no fixable finding.

    Returns the fixed source (None when the linter cannot read the text).
    """
    linter = Linter()
    linter.learn([(FILENAME, source)])
    allowed = {Applicability.SAFE, Applicability.UNSAFE} if unsafe else {Applicability.SAFE}
    try:
        before = linter.check(source, FILENAME)
    except SourceError:
        return None
    result = linter.fix(source, FILENAME, unsafe=unsafe)
    fixed = result.source
    assert not result.dropped, f"fixes that broke the file: {result.dropped}"
    if fixed == source:
        assert not [f for f in before if f.fix and f.fix.applicability in allowed]
        return fixed
    cst.parse_module(fixed)
    if python_compiles(source):
        assert python_compiles(fixed), f"--fix made the file invalid Python:\n{fixed}"
    left = [f for f in result.remaining if f.fix is not None and f.fix.applicability in allowed]
    assert not left, f"fixable findings left behind: {left}"
    again = linter.fix(fixed, FILENAME, unsafe=unsafe)
    assert again.source == fixed, "fixing twice changed more than fixing once"
    assert again.applied == 0
    problems = changes_outside(source, fixed, _fixed_rows(source, before, allowed))
    assert not problems, "--fix changed text outside the fixed statements:\n" + "\n".join(problems)
    if "\n" not in source.replace("\r\n", "") and "\r\n" in source:
        assert "\n" not in fixed.replace("\r\n", ""), "--fix added a bare \\n to a CRLF file"
    if "\n" not in source and "\r" in source:
        assert "\n" not in fixed, "--fix added a \\n to a CR file"
    # The runner reports the same outcome and no internal error.
    report, text = lint_text(linter, source, FILENAME, Mode.FIX, unsafe=unsafe)
    assert report.error is None, report.error
    assert text == fixed
    assert not report.notes, report.notes
    return fixed
