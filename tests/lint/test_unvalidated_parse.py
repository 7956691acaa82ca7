"""Parsing without re-validating the parser's output must give the very same trees, and must leave
validation on for every node built afterwards."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from replaylint.lint.syntax import unvalidated as unvalidated_parse
from replaylint.lint.syntax.unvalidated import parse_module

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [*(ROOT / "replaylint").rglob("*.py"), *(ROOT / "tests/lint/fixtures").glob("*.py")]
)


def test_validation_is_skipped_on_this_libcst() -> None:
    # If this fails, libcst's __post_init__ does more than validate: the fast path is off (and
    # parsing is about a fifth slower), which is safe but should be looked at.
    assert unvalidated_parse._CAN_SKIP


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_same_tree_as_a_validated_parse(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    fast, checked = parse_module(text), cst.parse_module(text)
    assert fast.deep_equals(checked)
    assert fast.code == text


def test_syntax_errors_are_still_raised() -> None:
    with pytest.raises(cst.ParserSyntaxError):
        parse_module("def f(:\n")


def test_nodes_built_after_a_parse_are_validated() -> None:
    parse_module("x = (1)\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("x", lpar=[cst.LeftParen()])  # unbalanced parentheses
