"""Which configuration each file follows, and which files a project learns names from.

Each named path follows the nearest ``replaylint.toml`` or ``pyproject.toml`` with a
``[tool.replaylint]`` table above it (``--config`` overrides that for every path), and so does
each file found inside it: a folder of its own with its own configuration follows that one, as
with ruff. Files that share a configuration form a *project* and are linted together.

A project learns gate-cache names from all of its files, whichever of them are named: pre-commit
passes only the staged files, and a name taught by a decode call in an unstaged file must still
count. The project's files are its configuration's folder (or, without a configuration, the git
work tree), found with the same excludes; the result cache makes reading them cost nothing on an
unchanged tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replaylint.lint.config.loading import find_config
from replaylint.lint.config.settings import Settings
from replaylint.lint.run.discovery import Discovered, discover

SettingsFor = Callable[[Path], Settings]
"""Settings for a file or folder: its nearest configuration, with the command line over it."""


@dataclass
class Project:
    """Files that follow one configuration, and the files they learn names from."""

    settings: Settings
    files: list[Discovered] = field(default_factory=list)
    root: Path | None = None
    """Where the project's files are found for learning; None: learn from ``files`` only."""
    named_root: bool = False
    """The root itself was named: ``files`` are all of the project already."""

    def learning_files(self) -> list[Discovered]:
        """Every file of the project, as paths relative to the working directory when inside it
        (so that a name's teacher reads the same whichever files were named)."""
        if self.root is None or self.named_root:
            return []
        found, _ = discover([self.root], self.settings)
        return [Discovered(_relative(item.path), explicit=False, root=item.root) for item in found]


def plan_projects(
    paths: Sequence[Path],
    settings_for: SettingsFor,
    *,
    config: Path | None = None,
    isolated: bool = False,
    force_exclude: bool = False,
) -> tuple[list[Project], list[str]]:
    """Group the files under ``paths`` by the configuration they follow; and path errors.
    ``config`` (one file for every path) and ``isolated`` (no configuration files) override the
    nearest configuration."""
    projects: dict[Path | None, Project] = {}
    errors: list[str] = []
    nearest = _NearestConfig()

    def project_of(target: Path, *, folder: bool) -> Project:
        key = config if config is not None or isolated else nearest.of(target, folder=folder)
        project = projects.get(key)
        if project is None:
            settings = settings_for(target)
            root = key.parent.absolute() if key is not None else _git_work_tree(target)
            project = projects[key] = Project(settings, root=root)
        return project

    seen: set[Path] = set()
    for given in paths:
        project = project_of(given, folder=given.is_dir())
        if project.root is not None and given.absolute() == project.root:
            project.named_root = True
        found, problems = discover([given], project.settings, force_exclude=force_exclude)
        errors.extend(problems)
        for item in found:
            if item.path not in seen:
                seen.add(item.path)
                project_of(item.path, folder=False).files.append(item)
    return [project for project in projects.values() if project.files], errors


class _NearestConfig:
    """The configuration file each folder follows, found once per folder (a tree of thousands
    of files has a few hundred folders, and each shares its parent's answer)."""

    def __init__(self) -> None:
        self._folders: dict[str, Path | None] = {}
        self._as_named: dict[str, Path | None] = {}

    def of(self, target: Path, *, folder: bool) -> Path | None:
        named = str(target) if folder else os.path.dirname(str(target))
        if named not in self._as_named:
            self._as_named[named] = self._in(os.path.abspath(named or "."))
        return self._as_named[named]

    def _in(self, folder: str) -> Path | None:
        if folder in self._folders:
            return self._folders[folder]
        found = _own_config(folder)
        if found is None:
            parent = os.path.dirname(folder)
            found = self._in(parent) if parent != folder else None
        self._folders[folder] = found
        return found


def _own_config(folder: str) -> Path | None:
    """The folder's own ``replaylint.toml``, or ``pyproject.toml`` with ``[tool.replaylint]``."""
    for name in ("replaylint.toml", "pyproject.toml"):
        if os.path.isfile(os.path.join(folder, name)):
            found = find_config(Path(folder))
            if found is not None and str(found.parent) == folder:
                return found
    return None


def _git_work_tree(target: Path) -> Path | None:
    git = shutil.which("git")
    if git is None:
        return None
    folder = target if target.is_dir() else target.parent
    try:
        done = subprocess.run(
            [git, "-C", str(folder or Path(".")), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    top = done.stdout.strip()
    return Path(top) if done.returncode == 0 and top else None


def _relative(path: Path) -> Path:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return Path(relative) if not relative.startswith("..") else path
