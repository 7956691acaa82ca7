"""The rule set. Each module holds one rule; :data:`ALL_RULES` lists them in code order."""

from __future__ import annotations

from replaylint.lint.rule import Rule
from replaylint.lint.rules.rl001_explicit_dtype import ExplicitNonFp32Dtype
from replaylint.lint.rules.rl002_non_literal_dtype import NonLiteralDtype
from replaylint.lint.rules.rl003_inherited_dtype import InheritedDtype
from replaylint.lint.rules.rl004_cast import NonFp32Cast
from replaylint.lint.rules.rl005_uncast_load import UncastLoad
from replaylint.lint.rules.rl006_shared_dtype import SharedDtype
from replaylint.lint.rules.rl007_entry_point_argument import EntryPointArgument

ALL_RULES: tuple[type[Rule], ...] = (
    ExplicitNonFp32Dtype,
    NonLiteralDtype,
    InheritedDtype,
    NonFp32Cast,
    UncastLoad,
    SharedDtype,
    EntryPointArgument,
)

RULES_BY_CODE: dict[str, type[Rule]] = {rule.CODE: rule for rule in ALL_RULES}

__all__ = ["ALL_RULES", "RULES_BY_CODE"]
