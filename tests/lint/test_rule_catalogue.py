"""The rule catalogue (codes, names, links known without libcst) must match the rules."""

from __future__ import annotations

from replaylint.lint.rules.catalogue import RULE_NAMES, rule_url
from replaylint.lint.rules.registry import ALL_RULES


def test_catalogue_lists_every_rule_in_order() -> None:
    assert list(RULE_NAMES.items()) == [(rule.CODE, rule.NAME) for rule in ALL_RULES]


def test_catalogue_links_are_the_rules_own() -> None:
    assert all(rule_url(rule.CODE) == rule.url() for rule in ALL_RULES)
