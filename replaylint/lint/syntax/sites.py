"""Where an expression is evaluated: the enclosing scopes and the statement that holds it."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

ScopeNode = cst.Module | cst.FunctionDef | cst.ClassDef


@dataclass(frozen=True)
class Site:
    """Where an expression is evaluated: the enclosing scopes, innermost last, and its statement."""

    scopes: tuple[ScopeNode, ...]
    statement: cst.CSTNode | None

    @property
    def scope(self) -> ScopeNode:
        return self.scopes[-1]

    def enclosing_class(self) -> cst.ClassDef | None:
        """The class whose method this site is in (``self.helper`` resolves there)."""
        if len(self.scopes) >= 2 and isinstance(self.scopes[-2], cst.ClassDef):
            return self.scopes[-2]
        return None
