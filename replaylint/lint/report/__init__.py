"""Output formats: ``text`` (with source snippets; ``full`` is its alias), ``concise``, ``json``,
``github``, ``gitlab``, ``junit``, ``sarif``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replaylint.lint.model import FileReport
from replaylint.lint.report.github import render_github
from replaylint.lint.report.gitlab import render_gitlab
from replaylint.lint.report.json_format import render_json
from replaylint.lint.report.junit import render_junit
from replaylint.lint.report.sarif import render_sarif
from replaylint.lint.report.text import render_concise, render_text

Renderer = Callable[[Sequence[FileReport]], str]

RENDERERS: dict[str, Renderer] = {
    "text": render_text,
    "full": render_text,
    "concise": render_concise,
    "json": render_json,
    "github": render_github,
    "gitlab": render_gitlab,
    "junit": render_junit,
    "sarif": render_sarif,
}
HUMAN_FORMATS = frozenset({"text", "full", "concise"})
"""Formats for people: they get the closing summary and, on a terminal, colour."""

__all__ = ["HUMAN_FORMATS", "RENDERERS", "Renderer"]
