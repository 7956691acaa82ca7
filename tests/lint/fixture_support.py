"""The realistic fixture modules under ``tests/lint/fixtures``: discovery and their annotations.

Each ``NAME.in.py`` is a module with gate-cache bugs; ``NAME.out.py`` is what
``replaylint --fix --unsafe-fixes`` must turn it into. A fixture *package* is a folder
``NAME/`` with an ``in/`` tree (a package whose modules import from each other) and the ``out/``
tree the fix must turn it into; it is linted with a project index over its ``in/`` tree, as a run
over the project would. A line comment ``# expect: RL002`` marks a
finding the fix removes, ``# expect-unfixed: RL007`` one that has no fix and stays (comments
survive the fix, so ``.out.py`` carries the same annotations).
"""

from __future__ import annotations

import re
from pathlib import Path

from replaylint.lint.engine import Linter
from replaylint.lint.project.index import ProjectIndex, module_names
from replaylint.lint.project.summaries import Summary, summarise

FIXTURES_DIR = Path(__file__).parent / "fixtures"
FIXTURES = sorted(FIXTURES_DIR.glob("*.in.py"))
PACKAGES = sorted(folder for folder in FIXTURES_DIR.iterdir() if (folder / "in").is_dir())

_ANNOTATION = re.compile(r"\bexpect(?P<unfixed>-unfixed)?:\s*(?P<codes>RL\d{3}(?:\s*,\s*RL\d{3})*)")

Expected = set[tuple[int, str]]


def output_of(fixture: Path) -> Path:
    return fixture.with_name(fixture.name.replace(".in.py", ".out.py"))


def expectations(text: str) -> tuple[Expected, Expected]:
    """(findings before the fix, findings that must remain after it) as (row, code) pairs."""
    before: Expected = set()
    after: Expected = set()
    for row, line in enumerate(text.splitlines(), start=1):
        if "#" not in line:
            continue
        comment = line[line.index("#") :]
        for match in _ANNOTATION.finditer(comment):
            codes = {code.strip() for code in match.group("codes").split(",")}
            before |= {(row, code) for code in codes}
            if match.group("unfixed"):
                after |= {(row, code) for code in codes}
    return before, after


def linter_for(fixture: Path, text: str) -> Linter:
    """A linter that has run the learning pass over the fixture, as the command line does."""
    linter = Linter()
    linter.learn([(str(fixture), text)])
    return linter


def package_modules(tree: Path) -> list[Path]:
    """Every module of a fixture package's tree (``NAME/in`` or ``NAME/out``), in path order."""
    return sorted(tree.rglob("*.py"))


def package_linter(tree: Path) -> Linter:
    """A linter with the project index of ``tree`` that has run the learning pass over it."""

    def load(path: str) -> tuple[Summary | None, str]:
        return summarise(Path(path).read_text(encoding="utf-8")), ""

    modules = package_modules(tree)
    linter = Linter(project=ProjectIndex(module_names(str(path) for path in modules), load))
    linter.learn([(str(path), path.read_text(encoding="utf-8")) for path in modules])
    return linter
