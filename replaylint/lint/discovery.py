"""Finding the files to lint: ``*.py`` and ``*.pyi`` under the given paths.

Directories are walked without following symlinked folders (no loops); ``exclude`` patterns and,
inside a git work tree, ``.gitignore`` rules prune the walk. Paths named explicitly are always
linted unless ``force_exclude`` is set (pre-commit passes every staged file explicitly).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from replaylint.lint.settings import Settings

PYTHON_SUFFIXES = (".py", ".pyi")


@dataclass(frozen=True)
class Discovered:
    path: Path
    explicit: bool
    """Named on the command line (as opposed to found by walking a folder)."""
    root: Path
    """The command-line path it was found under."""


def discover(
    paths: Sequence[Path], settings: Settings, *, force_exclude: bool = False
) -> tuple[list[Discovered], list[str]]:
    """The files to lint, sorted, and one error message per unusable path."""
    found: dict[Path, Discovered] = {}
    errors: list[str] = []
    walked: list[Discovered] = []
    for given in paths:
        if not given.exists() and not given.is_symlink():
            errors.append(f"{given}: no such file or directory")
            continue
        if given.is_dir():
            if force_exclude and settings.is_excluded(given):
                continue
            walked.extend(
                Discovered(path, explicit=False, root=given) for path in _walk(given, settings)
            )
        else:
            if force_exclude and settings.is_excluded(given):
                continue
            found.setdefault(given, Discovered(given, explicit=True, root=given.parent))
    for item in _drop_git_ignored(walked):
        found.setdefault(item.path, item)
    return sorted(found.values(), key=lambda d: str(d.path)), errors


def _walk(directory: Path, settings: Settings) -> Iterable[Path]:
    # Folders are pruned on the way down, so a name-only pattern needs checking against each
    # entry's own name; patterns with a "/" are matched against the whole path (rare: slower).
    patterns = (*settings.exclude, *settings.extend_exclude)
    by_name = re.compile(
        "|".join(fnmatch.translate(p.rstrip("/")) for p in patterns if "/" not in p.strip("/"))
        or "(?!)"
    )
    by_path = any("/" in p.strip("/") for p in patterns)

    def excluded(path: Path) -> bool:
        if by_name.match(path.name):
            return True
        return by_path and settings.is_excluded(path, walk_root=directory)

    for folder, subfolders, files in os.walk(directory, followlinks=False):
        base = Path(folder)
        subfolders[:] = sorted(d for d in subfolders if not excluded(base / d))
        for name in sorted(files):
            if name.endswith(PYTHON_SUFFIXES) and not excluded(base / name):
                yield base / name


def _drop_git_ignored(items: list[Discovered]) -> list[Discovered]:
    """Remove files that git ignores (tracked files are never ignored, as in git itself)."""
    git = shutil.which("git")
    if git is None or not items:
        return items
    by_repo: dict[Path, list[Discovered]] = {}
    for item in items:
        by_repo.setdefault(item.root, []).append(item)
    kept: list[Discovered] = []
    for root, group in by_repo.items():
        ignored = _git_ignored(git, root, [item.path for item in group])
        kept.extend(item for item in group if item.path.absolute() not in ignored)
    return kept


def _git_ignored(git: str, root: Path, paths: list[Path]) -> set[Path]:
    folder = root if root.is_dir() else root.parent
    try:
        completed = subprocess.run(
            [git, "check-ignore", "--stdin", "-z"],
            input=b"".join(os.fsencode(p.absolute()) + b"\0" for p in paths),
            cwd=folder,
            capture_output=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    # 0: some ignored, 1: none ignored, 128: not a git repository (or another fatal error).
    if completed.returncode != 0:
        return set()
    return {Path(os.fsdecode(p)).absolute() for p in completed.stdout.split(b"\0") if p}
