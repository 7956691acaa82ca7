"""Output formats: ``text`` (with source snippets; ``full`` is its alias), ``concise``, ``json``,
``github``, ``gitlab``, ``junit``, ``sarif``.

Each format's module is imported when that format is asked for, so a run answered from the
result cache pays only for the one it prints.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence

from replaylint.lint.model import FileReport

Renderer = Callable[[Sequence[FileReport]], str]

_FORMATS: dict[str, tuple[str, str]] = {
    "text": ("text", "render_text"),
    "full": ("text", "render_text"),
    "concise": ("text", "render_concise"),
    "json": ("json_format", "render_json"),
    "github": ("github", "render_github"),
    "gitlab": ("gitlab", "render_gitlab"),
    "junit": ("junit", "render_junit"),
    "sarif": ("sarif", "render_sarif"),
}


class _Renderers(Mapping[str, Renderer]):
    """Format name -> renderer, importing the renderer's module on first use."""

    def __getitem__(self, name: str) -> Renderer:
        module, function = _FORMATS[name]
        renderer: Renderer = getattr(importlib.import_module(f"{__name__}.{module}"), function)
        return renderer

    def __iter__(self) -> Iterator[str]:
        return iter(_FORMATS)

    def __len__(self) -> int:
        return len(_FORMATS)


RENDERERS: Mapping[str, Renderer] = _Renderers()
HUMAN_FORMATS = frozenset({"text", "full", "concise"})
"""Formats for people: they get the closing summary and, on a terminal, colour."""

__all__ = ["HUMAN_FORMATS", "RENDERERS", "Renderer"]
