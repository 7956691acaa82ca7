"""Where the project lives: the one setting every link (rule docs, SARIF) is built from."""

from __future__ import annotations

PROJECT_URL = "https://github.com/replaylint/replaylint"
"""The repository; rule documentation is read from its ``main`` branch."""


def docs_url(path: str) -> str:
    """The web address of ``path`` (relative to the repository root) on the main branch."""
    return f"{PROJECT_URL}/blob/main/{path}"
