"""Findings and fixes as rules state them: in terms of nodes, before any text is located.

:mod:`replaylint.lint.fixes.materialise` turns them into :class:`~replaylint.lint.model.Finding`
and :class:`~replaylint.lint.model.Fix` values with rows and columns, for the files that have
findings only (locating nodes costs a rendering of the module).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from replaylint.lint.model import Applicability


@dataclass(frozen=True)
class Replace:
    """Replace ``node``'s code with ``new`` (a node rendered in the module's style, or text)."""

    node: cst.CSTNode
    new: cst.CSTNode | str


@dataclass(frozen=True)
class InsertAfter:
    """Insert ``text`` right after ``node``'s code."""

    node: cst.CSTNode
    text: str


@dataclass(frozen=True)
class InsertLineAfter:
    """Insert ``text`` as a line of its own after the line where ``node`` ends, indented like
    the line where ``node`` starts (a trailing comment stays on ``node``'s line)."""

    node: cst.CSTNode
    text: str


@dataclass(frozen=True)
class AddModuleImport:
    """Insert ``import <module>`` at the top of the file, after docstring and __future__ imports."""

    module: str


EditDraft = Replace | InsertAfter | InsertLineAfter | AddModuleImport


@dataclass(frozen=True)
class FixDraft:
    """A fix as a rule states it, in terms of nodes; the engine turns it into text edits."""

    message: str
    edits: tuple[EditDraft, ...]
    applicability: Applicability = Applicability.SAFE


@dataclass
class FindingDraft:
    """A finding as a rule reports it: located at ``node``."""

    code: str
    node: cst.CSTNode
    message: str
    fix: FixDraft | None
