"""What the server knows about each project: its settings and the gate-cache names it teaches.

A file's project is the folder of its nearest configuration file (``replaylint.toml``, or a
``pyproject.toml`` with ``[tool.replaylint]``), else the workspace folder that holds it, else the
file's own folder. Learning reads only the project's files whose bytes contain an entry point's
literal text (the command line's cheap pre-filter), then, as the command line does, the getters
that return rings to those files and the project's wrappers of the decode kernel, so it costs
little even in a large tree; it is redone when a file of the project is saved. The project's
modules are indexed as in a command line run (:mod:`replaylint.lint.run.modules`): a dtype
imported from another module of the project resolves to its definition on disk, and saving a
module drops the summaries read so far. No pygls here: this is plain library code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replaylint.lint.config.loading import find_config, load_settings
from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.learning import entry_point_needles, learn_gate_cache_names
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.run.discovery import discover
from replaylint.lint.run.files import FileProblem, decode_source
from replaylint.lint.run.getters import learned_from_getters
from replaylint.lint.run.modules import RunModules
from replaylint.lint.run.one_file import lint_text
from replaylint.lint.run.taught import wrapper_rings


@dataclass
class Project:
    """One project: settings and the names its decode calls teach."""

    settings: Settings
    names: GateCacheNames | None = field(default=None, repr=False)
    modules: RunModules | None = field(default=None, repr=False)

    def learned_names(self) -> GateCacheNames:
        if self.names is None:
            self.names = self._learn()
        return self.names

    def _learn(self) -> GateCacheNames:
        settings = self.settings
        base = GateCacheNames(settings.gate_cache_patterns)
        needles = [n.encode() for n in entry_point_needles(settings.entry_points) or ()]
        files, _ = discover([settings.root], settings)
        self.modules = RunModules([item.path for item in files], dict, None)
        sources = []
        for item in files:
            try:
                raw = item.path.read_bytes()
            except OSError:
                continue
            if needles and not any(needle in raw for needle in needles):
                continue
            try:
                text, _ = decode_source(raw)
            except FileProblem:
                continue
            sources.append((str(item.path), text))
        learned = learn_gate_cache_names(sources, settings.entry_points, base)
        # the command line's later stages: rings returned by getters, rings passed to wrappers
        paths = [str(item.path) for item in files]
        learned.update(learned_from_getters(paths, base, learned, 1))
        learned.update(wrapper_rings(settings, [], paths, base, learned, None, 1))
        return base.with_learned(learned) if learned else base

    def lint(self, path: Path, text: str, mode: Mode = Mode.CHECK) -> tuple[FileReport, str]:
        """Lint (or fix) an editor buffer: the project's names plus what the buffer teaches."""
        from replaylint.lint.engine import Linter

        names = self.learned_names()
        project = self.modules.index if self.modules is not None else None
        linter = Linter(self.settings, gate_caches=names, project=project)
        linter.learn([(str(path), text)])
        return lint_text(linter, text, str(path), mode)

    def forget_names(self) -> None:
        self.names = None
        self.modules = None


class ProjectIndex:
    """Projects by configuration file (or folder), created on first use."""

    def __init__(self, workspace_folders: Sequence[Path] = ()) -> None:
        self.workspace_folders = [folder.absolute() for folder in workspace_folders]
        self._projects: dict[Path, Project] = {}

    def _root_without_config(self, path: Path) -> Path:
        holders = [f for f in self.workspace_folders if path.is_relative_to(f)]
        return max(holders, key=lambda f: len(f.parts)) if holders else path.parent

    def project_for(self, path: Path) -> Project:
        path = path.absolute()
        config = find_config(path)
        key = config.absolute() if config is not None else self._root_without_config(path)
        project = self._projects.get(key)
        if project is None:
            settings = load_settings(config=config) if config else Settings(root=key)
            project = self._projects[key] = Project(settings)
        return project

    def saved(self, path: Path) -> None:
        """A file was saved: relearn its project's names; reload settings if it was the config."""
        path = path.absolute()
        if path.name in {"pyproject.toml", "replaylint.toml"}:
            self._projects.clear()
            return
        for project in self._projects.values():
            if path.is_relative_to(project.settings.root.absolute()):
                project.forget_names()
