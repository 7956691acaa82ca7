"""Output formats: ``text`` (with source snippets), ``concise``, ``json``, ``github``, ``sarif``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replaylint.lint.reporters.github import render_github
from replaylint.lint.reporters.json_format import render_json
from replaylint.lint.reporters.sarif import render_sarif
from replaylint.lint.reporters.text import render_concise, render_text
from replaylint.lint.runner import FileReport

Renderer = Callable[[Sequence[FileReport]], str]

RENDERERS: dict[str, Renderer] = {
    "text": render_text,
    "concise": render_concise,
    "json": render_json,
    "github": render_github,
    "sarif": render_sarif,
}

__all__ = ["RENDERERS", "Renderer"]
