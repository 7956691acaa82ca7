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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from replaylint.lint.config.settings import Settings

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
    # Strings and os.scandir rather than Path objects: a monorepo has tens of thousands of entries.
    patterns = (*settings.exclude, *settings.extend_exclude)
    by_name = re.compile(
        "|".join(fnmatch.translate(p.rstrip("/")) for p in patterns if "/" not in p.strip("/"))
        or "(?!)"
    ).match
    by_path = any("/" in p.strip("/") for p in patterns)

    def excluded(name: str, path: str) -> bool:
        if by_name(name):
            return True
        return by_path and settings.is_excluded(Path(path), walk_root=directory)

    pending = [str(directory)]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError:
            continue  # unreadable folder: skipped, as os.walk does
        for entry in listed:
            name = entry.name
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            if is_folder:
                # Symlinked folders are not followed (no loops, nothing outside the tree).
                if not entry.is_symlink() and not excluded(name, entry.path):
                    pending.append(entry.path)
            elif name.endswith(PYTHON_SUFFIXES) and not excluded(name, entry.path):
                yield Path(entry.path)


def _inside_git_work_tree(folder: Path) -> bool:
    """A ``.git`` in the folder or above it (or git told where to look): only then can
    ``.gitignore`` rules apply, and only then is running git worth its start-up time."""
    if "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ:
        return True
    current = os.path.abspath(folder)
    while True:
        if os.path.lexists(os.path.join(current, ".git")):
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def _drop_git_ignored(items: list[Discovered]) -> list[Discovered]:
    """Remove files that git ignores (tracked files are never ignored, as in git itself)."""
    if not items:
        return items
    by_repo: dict[Path, list[Discovered]] = {}
    for item in items:
        by_repo.setdefault(item.root, []).append(item)
    kept: list[Discovered] = []
    git: str | None = None
    cwd = os.getcwd()
    for root, group in by_repo.items():
        folder = root if root.is_dir() else root.parent
        if not _inside_git_work_tree(folder):
            kept.extend(group)
            continue
        git = git or shutil.which("git")
        if git is None:
            return items
        absolute = [os.path.join(cwd, str(item.path)) for item in group]
        ignored = _git_ignored(git, folder, absolute)
        kept.extend(item for item, path in zip(group, absolute, strict=True) if path not in ignored)
    return kept


def _git_ignored(git: str, folder: Path, paths: list[str]) -> set[str]:
    import subprocess  # only inside a git work tree

    try:
        completed = subprocess.run(
            [git, "check-ignore", "--stdin", "-z"],
            input=b"".join(os.fsencode(p) + b"\0" for p in paths),
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
    return {os.fsdecode(p) for p in completed.stdout.split(b"\0") if p}
