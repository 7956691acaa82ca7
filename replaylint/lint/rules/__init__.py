"""The rule set. Each module holds one rule; :data:`ALL_RULES` lists them in code order."""

from __future__ import annotations

from replaylint.lint.rule import Rule
from replaylint.lint.rules.rl001_explicit_dtype import ExplicitNonFp32Dtype

ALL_RULES: tuple[type[Rule], ...] = (ExplicitNonFp32Dtype,)

RULES_BY_CODE: dict[str, type[Rule]] = {rule.CODE: rule for rule in ALL_RULES}

__all__ = ["ALL_RULES", "RULES_BY_CODE"]
