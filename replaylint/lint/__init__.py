"""replaylint's linter as a library.

::

    from replaylint.lint import Linter, load_settings

    settings = load_settings(config=Path("pyproject.toml"))
    linter = Linter(settings)
    linter.learn([("pool.py", pool_source), ("decode.py", decode_source)])
    for finding in linter.check(pool_source, "pool.py"):
        print(finding.location.row, finding.code, finding.message)
    fixed = linter.fix(pool_source, "pool.py").source

:func:`discover` finds the files under some paths as the command line does (``exclude``,
``.gitignore``) and :func:`lint_many` lints them (learning pass, pre-filter, result cache,
workers). docs/library.md documents the API with a tested example.
Names are imported on first use, so ``import replaylint.lint`` costs nothing; the analysis (and
libcst) is imported only with :class:`Linter`, :class:`Rule`, :class:`Valid` or :class:`Invalid`.
The package layout and its layers are described in ``docs/architecture.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replaylint.lint.config.loading import ConfigError, load_settings
    from replaylint.lint.config.settings import Settings
    from replaylint.lint.engine import Linter
    from replaylint.lint.fixes.converge import FixResult
    from replaylint.lint.gatecache.entry_points import EntryPoint
    from replaylint.lint.gatecache.names import GateCacheNames
    from replaylint.lint.model import (
        Applicability,
        Edit,
        FileReport,
        Finding,
        Fix,
        Location,
        Mode,
        SourceError,
    )
    from replaylint.lint.rules.base import Invalid, Rule, Valid
    from replaylint.lint.run.batch import lint_many
    from replaylint.lint.run.discovery import Discovered, discover

_EXPORTS: dict[str, str] = {
    "Applicability": "replaylint.lint.model",
    "ConfigError": "replaylint.lint.config.loading",
    "Discovered": "replaylint.lint.run.discovery",
    "Edit": "replaylint.lint.model",
    "EntryPoint": "replaylint.lint.gatecache.entry_points",
    "FileReport": "replaylint.lint.model",
    "Finding": "replaylint.lint.model",
    "Fix": "replaylint.lint.model",
    "FixResult": "replaylint.lint.fixes.converge",
    "GateCacheNames": "replaylint.lint.gatecache.names",
    "Invalid": "replaylint.lint.rules.base",
    "Linter": "replaylint.lint.engine",
    "Location": "replaylint.lint.model",
    "Mode": "replaylint.lint.model",
    "Rule": "replaylint.lint.rules.base",
    "Settings": "replaylint.lint.config.settings",
    "SourceError": "replaylint.lint.model",
    "Valid": "replaylint.lint.rules.base",
    "discover": "replaylint.lint.run.discovery",
    "lint_many": "replaylint.lint.run.batch",
    "load_settings": "replaylint.lint.config.loading",
}

__all__ = [
    "Applicability",
    "ConfigError",
    "Discovered",
    "Edit",
    "EntryPoint",
    "FileReport",
    "Finding",
    "Fix",
    "FixResult",
    "GateCacheNames",
    "Invalid",
    "Linter",
    "Location",
    "Mode",
    "Rule",
    "Settings",
    "SourceError",
    "Valid",
    "discover",
    "lint_many",
    "load_settings",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
