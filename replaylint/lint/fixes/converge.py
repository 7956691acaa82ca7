"""The fix loop: apply compatible fixes, re-check, repeat until nothing is left to fix.

Each round applies every fix that touches no text another chosen fix touches, then lints the
result again (a fix can make a new finding possible, or another fix's edits stale). A round whose
result does not parse keeps only the fixes that parse alone; a rule whose fix broke the file once
is not offered again in that run. The loop is bounded, and never returns unparsable source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from replaylint.lint.fixes.edits import apply_edits, select_compatible
from replaylint.lint.model import Applicability, Finding, Fix, SourceError
from replaylint.lint.syntax.parse import parse

MAX_FIX_ITERATIONS = 10

Checker = Callable[[str], list[Finding]]
"""Lints one text (the file's name and settings already bound)."""


@dataclass(frozen=True)
class FixResult:
    """The outcome of fixing one source text."""

    source: str
    remaining: tuple[Finding, ...]
    applied: int
    dropped: tuple[Finding, ...] = field(default=())
    """Findings whose fix was not applied because the result did not parse (an internal bug)."""


def fix_until_stable(check: Checker, source: str, *, unsafe: bool = False) -> FixResult:
    """Apply ``check``'s fixes to ``source`` until none is left (bounded)."""
    allowed = {Applicability.SAFE, Applicability.UNSAFE} if unsafe else {Applicability.SAFE}
    current = source
    applied = 0
    dropped: list[Finding] = []
    broken_codes: set[str] = set()  # a fix that broke the file once is not offered again
    findings = check(current)
    for _ in range(MAX_FIX_ITERATIONS):
        candidates = [
            f
            for f in findings
            if f.fix is not None and f.fix.applicability in allowed and f.code not in broken_codes
        ]
        if not candidates:
            break
        chosen = select_compatible(current, [f.fix for f in candidates if f.fix])
        updated, good = _apply_checked(current, chosen)
        for finding in candidates:
            if finding.fix in chosen and finding.fix not in good:
                dropped.append(finding)
                broken_codes.add(finding.code)
        if updated == current:
            break
        applied += len(good)
        current = updated
        findings = check(current)
    return FixResult(current, tuple(findings), applied, tuple(dropped))


def _parses(source: str) -> bool:
    try:
        parse(source)
    except SourceError:
        return False
    return True


def _apply_checked(source: str, fixes: list[Fix]) -> tuple[str, list[Fix]]:
    """Apply ``fixes`` together; if the result does not parse, keep only those that parse alone."""
    if not fixes:
        return source, []
    combined = apply_edits(source, [edit for fix in fixes for edit in fix.edits])
    if _parses(combined):
        return combined, fixes
    good = [fix for fix in fixes if _parses(apply_edits(source, fix.edits))]
    if not good:
        return source, []
    combined = apply_edits(source, [edit for fix in good for edit in fix.edits])
    return (combined, good) if _parses(combined) else (source, [])
