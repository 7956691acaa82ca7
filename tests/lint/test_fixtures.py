"""The fixture modules, textually: the findings are exactly the annotated ones, ``--fix`` gives the
golden ``.out.py``, and the fixes converge.

Set ``REPLAYLINT_UPDATE_FIXTURES=1`` to rewrite the ``.out.py`` files after a deliberate change
(then review the diff).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from fixture_support import FIXTURES, expectations, linter_for, output_of

from replaylint.lint.model import Applicability
from replaylint.lint.rules.registry import ALL_RULES

pytestmark = pytest.mark.skipif(not FIXTURES, reason="no fixture files found")


def _ids(path: Path) -> str:
    return path.name.removesuffix(".in.py")


@pytest.mark.parametrize("fixture", FIXTURES, ids=_ids)
def test_findings_are_exactly_the_annotated_ones(fixture: Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    expected, _ = expectations(text)
    findings = linter_for(fixture, text).check(text, str(fixture))
    assert {(f.location.row, f.code) for f in findings} == expected


@pytest.mark.parametrize("fixture", FIXTURES, ids=_ids)
def test_fix_gives_the_golden_output(fixture: Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    result = linter_for(fixture, text).fix(text, str(fixture), unsafe=True)
    assert result.dropped == ()
    golden = output_of(fixture)
    if os.environ.get("REPLAYLINT_UPDATE_FIXTURES"):
        golden.write_text(result.source, encoding="utf-8")
    assert result.source == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("fixture", FIXTURES, ids=_ids)
def test_only_unfixable_findings_remain_and_fixes_converge(fixture: Path) -> None:
    fixed = output_of(fixture).read_text(encoding="utf-8")
    _, remaining = expectations(fixed)
    linter = linter_for(fixture, fixed)
    findings = linter.check(fixed, str(fixture))
    assert {(f.location.row, f.code) for f in findings} == remaining
    assert all(f.fix is None for f in findings)
    assert linter.fix(fixed, str(fixture), unsafe=True).source == fixed


@pytest.mark.parametrize("fixture", FIXTURES, ids=_ids)
def test_safe_fixes_alone_leave_the_unsafe_ones(fixture: Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    linter = linter_for(fixture, text)
    before = linter.check(text, str(fixture))
    unsafe = sum(
        1 for f in before if f.fix is not None and f.fix.applicability is Applicability.UNSAFE
    )
    result = linter.fix(text, str(fixture))
    left_with_unsafe_fix = [
        f for f in result.remaining if f.fix and f.fix.applicability is Applicability.UNSAFE
    ]
    assert all(f.fix is None or f in left_with_unsafe_fix for f in result.remaining)
    assert len(left_with_unsafe_fix) == unsafe


def test_every_rule_is_exercised_by_the_fixtures() -> None:
    counts: Counter[str] = Counter()
    for fixture in FIXTURES:
        expected, _ = expectations(fixture.read_text(encoding="utf-8"))
        counts.update(code for _, code in expected)
    assert {rule.CODE for rule in ALL_RULES} <= {code for code, n in counts.items() if n >= 2}
