"""Every rule's code, name and documentation link, known without importing the rules.

A rule is defined by its module: ``rl001_explicit_non_fp32_dtype.py`` holds rule ``RL001``,
named ``explicit-non-fp32-dtype``. The catalogue reads the names of this package's modules, so the
command line, the cache key and the reporters know every rule without importing one (the rules
import libcst, which costs more than a whole run answered from the result cache).
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

from replaylint._project import docs_url

__all__ = ["RULE_MODULES", "RULE_NAMES", "rule_identity", "rule_url"]

_RULE_MODULE = re.compile(r"rl(?P<number>\d{3})_(?P<name>[a-z0-9_]+)")


def rule_identity(module_name: str) -> tuple[str, str] | None:
    """``("RL001", "explicit-non-fp32-dtype")`` for a rule module's (last) name, else None."""
    match = _RULE_MODULE.fullmatch(module_name.rpartition(".")[2])
    if match is None:
        return None
    return f"RL{match['number']}", match["name"].replace("_", "-")


def _rule_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        identity = rule_identity(module.name)
        if identity is not None:
            found[identity[0]] = module.name
    return dict(sorted(found.items()))


RULE_MODULES: dict[str, str] = _rule_modules()
"""Every rule's code and the module (in this package) that defines it, in code order."""

RULE_NAMES: dict[str, str] = {
    code: identity[1]
    for code, module in RULE_MODULES.items()
    if (identity := rule_identity(module)) is not None
}
"""Every rule's code and kebab-case name, in code order."""


def rule_url(code: str) -> str:
    """Where rule ``code`` is documented."""
    return docs_url(f"docs/rules/{code}.md")
