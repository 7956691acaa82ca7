"""The rule base class: one self-contained unit of code, message, rationale, fix and examples.

A rule is a libcst ``BatchableCSTVisitor``: every enabled rule of a run walks a file in one shared
traversal. Its class attributes are its documentation (``replaylint rule RL001`` and
``docs/rules/`` are generated from them) and its ``VALID``/``INVALID`` examples are its tests.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import libcst as cst

from replaylint.lint.findings import Applicability

if TYPE_CHECKING:
    from replaylint.lint.context import FileContext, FixDraft


@dataclass(frozen=True)
class Valid:
    """Code the rule must accept without a finding."""

    code: str

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


@dataclass(frozen=True)
class Invalid:
    """Code the rule must flag; ``expected_fix`` is the source after ``--fix --unsafe-fixes``.

    ``expected_fix=None`` states that the finding has no fix.
    """

    code: str
    expected_fix: str | None = None
    message_contains: str | None = None

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")

    @property
    def fixed_source(self) -> str | None:
        if self.expected_fix is None:
            return None
        return textwrap.dedent(self.expected_fix).lstrip("\n")


class Rule(cst.BatchableCSTVisitor):
    """Base class of every lint rule. Subclasses set the class attributes and visit nodes."""

    CODE: ClassVar[str]
    NAME: ClassVar[str]
    """Short kebab-case name, e.g. ``explicit-non-fp32-dtype``."""
    SUMMARY: ClassVar[str]
    """What the rule finds, one sentence."""
    RATIONALE: ClassVar[str]
    """Why it matters (markdown)."""
    FIX: ClassVar[str]
    """What the fix does, or why there is none (markdown)."""
    FIX_APPLICABILITY: ClassVar[Applicability | None]
    """Applicability of the rule's fixes; ``None`` when it offers none."""
    VALID: ClassVar[Sequence[Valid]]
    INVALID: ClassVar[Sequence[Invalid]]

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    def report(self, node: cst.CSTNode, message: str, *, fix: FixDraft | None = None) -> None:
        """Record a finding located at ``node`` (the smallest expression it is about)."""
        self.context.add_finding(self.CODE, node, message, fix)

    @classmethod
    def url(cls) -> str:
        return f"https://github.com/replaylint/replaylint/blob/main/docs/rules/{cls.CODE}.md"
