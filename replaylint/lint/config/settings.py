"""Resolved settings of a run: which rules, which files, which names are gate caches."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from replaylint.lint.gatecache.entry_points import DEFAULT_ENTRY_POINTS, EntryPoint
from replaylint.lint.gatecache.names import DEFAULT_GATE_CACHE_PATTERNS

DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".hg",
    ".mypy_cache",
    ".nox",
    ".pants.d",
    ".pytype",
    ".replaylint_cache",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".venv",
    "__pypackages__",
    "_build",
    "buck-out",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
)


def selector_matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _specificity(selectors: Iterable[str], code: str) -> int:
    """Length of the most specific selector that matches ``code`` (``ALL`` counts as 0), or -1."""
    best = -1
    for selector in selectors:
        if selector_matches(selector, code):
            best = max(best, 0 if selector == "ALL" else len(selector))
    return best


def apply_selection_layer(
    enabled: Iterable[str],
    codes: Iterable[str],
    select: tuple[str, ...] | None,
    extend_select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """The codes enabled after one more layer of options (ruff's resolution: the command line is
    a layer over the configuration file).

    A layer's ``select`` replaces what the earlier layers enabled; otherwise they are its base.
    Within the layer the most specific selector wins and ``ignore`` wins a tie, so
    ``--extend-select RL001`` overrides a configured ``ignore = ["RL001"]``.
    """
    before = set(enabled) if select is None else set()
    result = []
    for code in codes:
        chosen = max(_specificity(select or (), code), _specificity(extend_select, code))
        ignored = _specificity(ignore, code)
        if (chosen >= 0 and chosen > ignored) or (ignored < 0 and code in before):
            result.append(code)
    return tuple(result)


def path_matches(pattern: str, relative: PurePosixPath) -> bool:
    """gitignore-like: a pattern without ``/`` matches any path component, else the whole path."""
    pattern = pattern.rstrip("/")
    if "/" not in pattern:
        return any(fnmatch.fnmatchcase(part, pattern) for part in relative.parts)
    pattern = pattern.lstrip("/")
    text = relative.as_posix()
    return fnmatch.fnmatchcase(text, pattern) or fnmatch.fnmatchcase(text, pattern + "/*")


@dataclass(frozen=True)
class Settings:
    """Everything a run needs to know besides the files themselves."""

    root: Path = field(default_factory=Path.cwd)
    config_path: Path | None = None
    select: tuple[str, ...] = ("RL",)
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    gate_cache_patterns: tuple[str, ...] = DEFAULT_GATE_CACHE_PATTERNS
    entry_points: tuple[EntryPoint, ...] = DEFAULT_ENTRY_POINTS

    def is_enabled(self, code: str) -> bool:
        """ruff's semantics: the most specific selector wins; ``ignore`` wins a tie."""
        selected = max(_specificity(self.select, code), _specificity(self.extend_select, code))
        return selected >= 0 and selected > _specificity(self.ignore, code)

    def relative(self, path: Path) -> PurePosixPath | None:
        try:
            return PurePosixPath(path.absolute().relative_to(self.root.absolute()).as_posix())
        except ValueError:
            return None

    def is_excluded(self, path: Path, *, walk_root: Path | None = None) -> bool:
        """Whether ``exclude``/``extend-exclude`` match ``path``.

        With ``walk_root`` (the folder named on the command line that ``path`` was found under),
        a pattern without ``/`` only matches the components below it: a folder you name is
        linted even when it, or a folder above it, has an excluded name (``venv/myproj``).
        """
        relative = self.relative(path)
        if relative is None:
            relative = PurePosixPath(path.name)
        patterns = (*self.exclude, *self.extend_exclude)
        if walk_root is None:
            return any(path_matches(p, relative) for p in patterns)
        below = PurePosixPath(path.relative_to(walk_root).as_posix())
        return any(path_matches(p, relative if "/" in p.strip("/") else below) for p in patterns)

    def ignored_for_file(self, path: Path) -> tuple[str, ...]:
        """Code prefixes ``per-file-ignores`` disables for ``path`` (``ALL`` becomes ``""``, the
        prefix of every code)."""
        relative = self.relative(path) or PurePosixPath(path.name)
        ignored: list[str] = []
        for pattern, codes in self.per_file_ignores:
            if path_matches(pattern, relative) or fnmatch.fnmatchcase(relative.name, pattern):
                ignored.extend("" if code == "ALL" else code for code in codes)
        return tuple(ignored)
