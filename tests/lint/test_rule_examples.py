"""Every rule's VALID and INVALID examples, run as tests: they are its documentation too."""

from __future__ import annotations

import pytest

from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.registry import ALL_RULES


def _cases(kind: str) -> list[pytest.param]:
    cases = []
    for rule in ALL_RULES:
        examples = rule.VALID if kind == "valid" else rule.INVALID
        for number, example in enumerate(examples):
            cases.append(pytest.param(rule, example, id=f"{rule.CODE}-{kind}-{number}"))
    return cases


def _linter(rule: type[Rule]) -> Linter:
    return Linter(Settings(select=(rule.CODE,)))


@pytest.mark.parametrize(("rule", "example"), _cases("valid"))
def test_valid_example_has_no_finding(rule: type[Rule], example: Valid) -> None:
    assert _linter(rule).check(example.source, "example.py") == []


@pytest.mark.parametrize(("rule", "example"), _cases("invalid"))
def test_invalid_example_is_flagged_and_fixed(rule: type[Rule], example: Invalid) -> None:
    linter = _linter(rule)
    findings = linter.check(example.source, "example.py")
    assert findings, f"{rule.CODE} did not flag:\n{example.source}"
    assert {f.code for f in findings} == {rule.CODE}
    if example.message_contains is not None:
        assert any(example.message_contains in f.message for f in findings)
    result = linter.fix(example.source, "example.py", unsafe=True)
    if example.fixed_source is None:
        assert all(f.fix is None for f in findings)
        assert result.source == example.source
    else:
        assert result.source == example.fixed_source
        assert result.remaining == ()
        # Fixes converge: fixing the fixed source changes nothing.
        assert linter.fix(result.source, "example.py", unsafe=True).source == result.source


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.CODE)
def test_rule_is_documented(rule: type[Rule]) -> None:
    assert rule.CODE.startswith("RL")
    assert len(rule.CODE) == 5
    assert rule.NAME
    assert rule.NAME.lower() == rule.NAME
    assert " " not in rule.NAME
    assert rule.SUMMARY.endswith(".")
    assert len(rule.RATIONALE) > 200
    assert rule.FIX.strip()
    assert len(rule.VALID) >= 3
    assert len(rule.INVALID) >= 3


def test_codes_are_unique_and_ordered() -> None:
    codes = [rule.CODE for rule in ALL_RULES]
    assert codes == sorted(set(codes))


@pytest.mark.parametrize(("rule", "example"), _cases("valid"))
def test_valid_example_is_clean_under_every_rule(rule: type[Rule], example: Valid) -> None:
    # A VALID example is correct code: no other rule may cry wolf on it either.
    assert Linter().check(example.source, "example.py") == []
