"""A run's project index: module names of the project's files, summaries through the result cache.

The analysis of one file may read the summaries of the project modules it imports from
(:mod:`replaylint.lint.project`), so its cached results are keyed on them too: the key of an
analysed file's results is the learned names' key plus a fingerprint of its dependencies'
summaries. A file ruled out by the pre-filter holds no finding whatever its imports say, and keeps
the plain key. Summaries are kept in the result cache by content digest: a module whose size and
mtime are unchanged is neither read nor parsed to know its summary.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from replaylint.lint.project.index import ProjectIndex, module_names, summary_digest
from replaylint.lint.project.summaries import Summary, summarise
from replaylint.lint.run.cache import ResultCache, digest
from replaylint.lint.run.files import FileProblem, decode_source


class RunModules:
    """The project index of one run, built on first use."""

    def __init__(
        self, paths: Iterable[Path], digests: dict[str, str], cache: ResultCache | None
    ) -> None:
        self._paths = [str(path) for path in paths]
        self._digests = digests
        """Absolute path -> content digest, for the files whose digest the run knows."""
        self._cache = cache
        self._index: ProjectIndex | None = None
        self._keys: dict[str, str] = {}

    @property
    def index(self) -> ProjectIndex:
        if self._index is None:
            self._index = ProjectIndex(module_names(self._paths), self._load)
        return self._index

    def _load(self, path: str) -> Summary | None:
        known = self._digests.get(os.path.abspath(path), "")
        if known and self._cache is not None:
            found, summary = self._cache.summary(known)
            if found:
                return summary  # type: ignore[no-any-return]
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
            text, _ = decode_source(raw)
        except (OSError, FileProblem):
            return None
        summary = summarise(text)
        if self._cache is not None:
            self._cache.put_summary(digest(raw), summary)
        return summary

    def result_key(self, learned_key: str, path: str) -> str:
        """The key of an analysed file's results: the learned names and what it imports."""
        absolute = os.path.abspath(path)
        key = self._keys.get(absolute)
        if key is None:
            index = self.index
            module = index.module_of(absolute)
            dependencies: list[Any] = []
            if module is not None:
                for name in sorted(index.dependencies(module) - {module}):
                    dependencies.append((name, summary_digest(index.summary(name))))
            fingerprint = hashlib.blake2b(repr(dependencies).encode(), digest_size=12)
            key = self._keys[absolute] = fingerprint.hexdigest()
        return f"{learned_key}:{key}"

    def answers(self, stored_key: str, learned_key: str, path: str) -> bool:
        """Whether results cached under ``stored_key`` hold for this run."""
        if stored_key == learned_key:
            return True  # ruled out by the pre-filter: no import changes that
        if not stored_key.startswith(f"{learned_key}:"):
            return False
        return stored_key == self.result_key(learned_key, path)
