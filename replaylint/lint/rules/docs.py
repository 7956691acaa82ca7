"""Rule documentation generated from the rules themselves.

``replaylint rule RL001`` prints it, ``docs/rules/RL001.md`` holds it and the README's rule table
is built from it; ``python -m replaylint.lint.rules.docs`` rewrites both files, and a test checks
they are current.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Rule
from replaylint.lint.rules.registry import ALL_RULES

TABLE_BEGIN = "<!-- begin rule table (generated: python -m replaylint.lint.rules.docs) -->"
TABLE_END = "<!-- end rule table -->"


def fix_label(rule: type[Rule]) -> str:
    if rule.FIX_APPLICABILITY is None:
        return "none"
    return "safe" if rule.FIX_APPLICABILITY is Applicability.SAFE else "unsafe"


def rule_markdown(rule: type[Rule]) -> str:
    parts = [
        f"# {rule.CODE}: {rule.NAME}",
        "",
        rule.SUMMARY,
        "",
        f"Fix: **{fix_label(rule)}**.",
        "",
        "## Why it matters",
        "",
        rule.RATIONALE.strip(),
        "",
        "## Fix",
        "",
        rule.FIX.strip(),
        "",
        "## Flagged",
    ]
    for example in rule.INVALID:
        parts += ["", "```python", example.source.rstrip(), "```"]
        if example.fixed_source is not None:
            parts += ["", "becomes", "", "```python", example.fixed_source.rstrip(), "```"]
    parts += ["", "## Not flagged"]
    for valid in rule.VALID:
        parts += ["", "```python", valid.source.rstrip(), "```"]
    return "\n".join(parts) + "\n"


def rule_table(rules: Sequence[type[Rule]] = ALL_RULES) -> str:
    rows = ["| Code | Name | What it finds | Fix |", "| --- | --- | --- | --- |"]
    for rule in rules:
        rows.append(
            f"| [{rule.CODE}](docs/rules/{rule.CODE}.md) | `{rule.NAME}` | {rule.SUMMARY} | "
            f"{fix_label(rule)} |"
        )
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(readme):
        raise ValueError(f"README.md lacks the markers {TABLE_BEGIN!r} ... {TABLE_END!r}")
    return pattern.sub(lambda _: f"{TABLE_BEGIN}\n{rule_table()}\n{TABLE_END}", readme)


def expected_files(root: Path) -> dict[Path, str]:
    """Every generated file and the content it must have."""
    files = {root / "docs" / "rules" / f"{rule.CODE}.md": rule_markdown(rule) for rule in ALL_RULES}
    readme = root / "README.md"
    files[readme] = readme_with_table(readme.read_text(encoding="utf-8"))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    root = Path(argv[0] if argv else ".")
    for path, content in expected_files(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != content:
            path.write_text(content, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
