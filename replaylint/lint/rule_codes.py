"""Rule codes and documentation links, known without importing the rules (and so libcst).

A run whose every file is answered by the cache never needs libcst, whose import alone costs
about a third of a second; this module lets the command line validate selectors and print links
without it. Codes come from the rule modules' names (``rules/rl001_*.py`` is RL001); a test checks
they agree with the rules themselves.
"""

from __future__ import annotations

import functools
import pkgutil
import re
from pathlib import Path

_RULE_MODULE = re.compile(r"rl(\d{3})_\w+")
DOCS_URL = "https://github.com/replaylint/replaylint/blob/main/docs/rules/{code}.md"


@functools.cache
def known_codes() -> tuple[str, ...]:
    folder = Path(__file__).with_name("rules")
    codes = {
        f"RL{match.group(1)}"
        for module in pkgutil.iter_modules([str(folder)])
        if (match := _RULE_MODULE.fullmatch(module.name))
    }
    return tuple(sorted(codes))


def rule_url(code: str) -> str:
    return DOCS_URL.format(code=code)
