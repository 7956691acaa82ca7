"""A run's project index: module names of the project's files, summaries through the result cache.

The analysis of one file may read the summaries of other project modules it imports from
(:mod:`replaylint.lint.project`); the index records which, and the file's cached results list
those modules with their content digests (:attr:`~replaylint.lint.model.FileReport.dependencies`).
The results hold while every listed file has that digest: a change of a policy module re-lints
its importers, and only them. A file ruled out by the pre-filter holds no finding whatever its
imports say, and lists none. Summaries are kept in the result cache by content digest, so a module
whose size and mtime are unchanged is neither read nor parsed to know its summary.

A module added later that an import would now reach instead (a new ``pkg/name.py`` where
``from pkg import name`` read a name of ``pkg/__init__.py``) is not seen by cached results until
the importer or a module it read changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from replaylint.lint.run.cache import ResultCache, digest
from replaylint.lint.run.files import FileProblem, decode_source

if TYPE_CHECKING:  # imported on use: a run answered from the cache builds no index
    from replaylint.lint.project.index import ProjectIndex
    from replaylint.lint.project.summaries import Summary


class RunModules:
    """The project index of one run, built on first use."""

    def __init__(
        self,
        paths: Iterable[Path],
        digests: Callable[[], dict[str, str]],
        cache: ResultCache | None,
    ) -> None:
        self._paths = paths
        self._known_digests = digests
        self._digests: dict[str, str] | None = None
        self._cache = cache
        self._index: ProjectIndex | None = None

    @property
    def digests(self) -> dict[str, str]:
        """Absolute path -> content digest, for the files whose digest the run knows (built on
        first use: a warm run whose results read no other module never needs it)."""
        if self._digests is None:
            self._digests = self._known_digests()
        return self._digests

    @property
    def index(self) -> ProjectIndex:
        if self._index is None:
            from replaylint.lint.project.index import ProjectIndex, module_names

            self._index = ProjectIndex(
                module_names(str(p) for p in self._paths), self._load, reader=self._read
            )
        return self._index

    def _read(self, path: str) -> tuple[bytes, str] | None:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        known = self.digests.get(os.path.abspath(path), "")
        return raw, known or digest(raw)

    def _load(self, path: str) -> tuple[Summary | None, str]:
        known = self.digests.get(os.path.abspath(path), "")
        if known and self._cache is not None:
            found, summary = self._cache.summary(known)
            if found and (summary is None or _well_formed(summary)):
                return summary, known
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
            text, _ = decode_source(raw)
        except (OSError, FileProblem):
            return None, ""
        from replaylint.lint.project.summaries import summarise

        summary = summarise(text)
        content = digest(raw)
        if self._cache is not None:
            self._cache.put_summary(content, summary)
        return summary, content

    def unchanged(self, dependencies: Sequence[tuple[str, str]]) -> bool:
        """Whether every file of ``dependencies`` still has its recorded content digest."""
        for path, recorded in dependencies:
            current = self.digests.get(path)
            if current is None:  # not a file the run has looked at: read it
                try:
                    with open(path, "rb") as handle:
                        current = self.digests[path] = digest(handle.read())
                except OSError:
                    return False
            if current != recorded:
                return False
        return True


def _well_formed(summary: object) -> bool:
    """Whether a stored summary has the shape :mod:`replaylint.lint.project.summaries` writes."""
    return (
        isinstance(summary, dict)
        and isinstance(summary.get("names"), dict)
        and isinstance(summary.get("assigned"), list)
        and isinstance(summary.get("imports"), list)
    )
