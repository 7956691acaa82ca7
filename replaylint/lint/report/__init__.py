"""Output formats: ``text`` (with source snippets), ``concise``, ``json``, ``github``, ``sarif``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replaylint.lint.model import FileReport
from replaylint.lint.report.github import render_github
from replaylint.lint.report.json_format import render_json
from replaylint.lint.report.sarif import render_sarif
from replaylint.lint.report.text import render_concise, render_text

Renderer = Callable[[Sequence[FileReport]], str]

RENDERERS: dict[str, Renderer] = {
    "text": render_text,
    "concise": render_concise,
    "json": render_json,
    "github": render_github,
    "sarif": render_sarif,
}

__all__ = ["RENDERERS", "Renderer"]
