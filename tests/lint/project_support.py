"""Small projects on disk for tests of the cross-module analysis: write the files, index them,
lint one of them the way a run with the project index does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding
from replaylint.lint.project.index import ProjectIndex, module_names
from replaylint.lint.project.summaries import summarise

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_tree(root: Path, files: dict[str, str]) -> list[Path]:
    """Writes ``files`` (relative path -> dedented text) under ``root``; returns their paths."""
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        paths.append(path)
    return paths


def index_of(paths: list[Path]) -> ProjectIndex:
    def load(path: str) -> tuple[dict[str, object] | None, str]:
        return summarise(Path(path).read_text(encoding="utf-8")), ""

    return ProjectIndex(module_names(str(p) for p in paths), load)


def lint_in_project(root: Path, files: dict[str, str], target: str) -> list[Finding]:
    """The findings of ``target`` (one of ``files``) with the whole tree as its project."""
    paths = write_tree(root, files)
    linter = Linter(project=index_of(paths))
    path = root / target
    return linter.check(path.read_text(encoding="utf-8"), str(path))


def fix_in_project(root: Path, files: dict[str, str], target: str) -> str:
    """``target``'s text after ``--fix --unsafe-fixes`` with the whole tree as its project."""
    paths = write_tree(root, files)
    linter = Linter(project=index_of(paths))
    path = root / target
    return linter.fix(path.read_text(encoding="utf-8"), str(path), unsafe=True).source


def cli_rows(root: Path, *args: str) -> list[tuple[str, int, str]]:
    """(path relative to ``root``, row, code) of each finding of ``replaylint check`` run in
    ``root`` with ``args``, sorted."""
    done = subprocess.run(
        [sys.executable, "-m", "replaylint", "check", "--output-format", "json", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in {0, 1}, done.stderr
    return sorted(
        (
            Path(f["filename"]).resolve().relative_to(root.resolve()).as_posix(),
            f["location"]["row"],
            f["code"],
        )
        for f in json.loads(done.stdout)
    )
