"""The rule classes, imported from the modules the catalogue lists, in code order."""

from __future__ import annotations

import importlib

from replaylint.lint.rules.base import Rule
from replaylint.lint.rules.catalogue import RULE_MODULES

__all__ = ["ALL_RULES", "RULES_BY_CODE"]


def _rule_in(module_name: str) -> type[Rule]:
    module = importlib.import_module(f"{__package__}.{module_name}")
    rules = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Rule)
        and value.__module__ == module.__name__
    ]
    if len(rules) != 1:
        raise ImportError(f"{module.__name__} must define exactly one Rule, not {len(rules)}")
    return rules[0]


ALL_RULES: tuple[type[Rule], ...] = tuple(_rule_in(module) for module in RULE_MODULES.values())
RULES_BY_CODE: dict[str, type[Rule]] = {rule.CODE: rule for rule in ALL_RULES}
