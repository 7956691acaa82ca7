"""The rule docs and the README's rule table are generated from the rules: they must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from replaylint.lint.rules.docs import expected_files, rule_markdown
from replaylint.lint.rules.registry import ALL_RULES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted(expected_files(ROOT)), ids=lambda p: p.name)
def test_generated_file_is_current(path: Path) -> None:
    expected = expected_files(ROOT)[path]
    assert path.exists(), f"{path} is missing: run `python -m replaylint.lint.rules.docs`"
    assert path.read_text(encoding="utf-8") == expected, (
        f"{path.relative_to(ROOT)} is stale: run `python -m replaylint.lint.rules.docs`"
    )


def test_rule_command_prints_the_docs() -> None:
    rule = ALL_RULES[0]
    completed = subprocess.run(
        [sys.executable, "-m", "replaylint", "rule", rule.CODE.lower()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == rule_markdown(rule)


def test_rule_command_all_and_unknown() -> None:
    every = subprocess.run(
        [sys.executable, "-m", "replaylint", "rule", "--all"], capture_output=True, text=True
    )
    assert every.returncode == 0
    for rule in ALL_RULES:
        assert f"# {rule.CODE}: {rule.NAME}" in every.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "replaylint", "rule", "RL999"], capture_output=True, text=True
    )
    assert unknown.returncode == 2
    assert "unknown rule `RL999`" in unknown.stderr
