"""Rule codes, names and documentation links, known without importing the rules.

The rules are libcst visitors, and importing libcst costs about a quarter of a second: more than a
whole run answered from the result cache. The command line, the cache key and the reporters need
only what is listed here. ``tests/lint/test_rule_catalogue.py`` checks it against the rules.
"""

from __future__ import annotations

__all__ = ["RULE_NAMES", "rule_url"]

RULE_NAMES: dict[str, str] = {
    "RL001": "explicit-non-fp32-dtype",
    "RL002": "non-literal-dtype",
    "RL003": "inherited-dtype",
    "RL004": "non-fp32-cast",
    "RL005": "uncast-load",
    "RL006": "shared-cache-dtype",
    "RL007": "non-fp32-gate-argument",
}
"""Every rule's code and kebab-case name, in code order."""

_DOCS_URL = "https://github.com/replaylint/replaylint/blob/main/docs/rules/{code}.md"


def rule_url(code: str) -> str:
    """Where rule ``code`` is documented."""
    return _DOCS_URL.format(code=code)
