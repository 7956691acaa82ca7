"""Where an added ``import torch`` goes: after the docstring and ``__future__`` imports."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.model import Edit, LineIndex, Location, newline_of
from replaylint.lint.syntax.positions import NodePositions


def _is_docstring_or_future(small: cst.BaseSmallStatement, first: bool) -> bool:
    """The module docstring (a string, also implicitly concatenated) or a ``__future__`` import:
    what must stay before an inserted import."""
    if first and isinstance(small, cst.Expr) and _is_plain_string(small.value):
        return True
    return (
        isinstance(small, cst.ImportFrom)
        and isinstance(small.module, cst.Name)
        and small.module.value == "__future__"
    )


def _is_plain_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.ConcatenatedString):
        return _is_plain_string(node.left) and _is_plain_string(node.right)
    return isinstance(node, cst.SimpleString)


def import_anchor(module: cst.Module) -> cst.CSTNode | None:
    """What an inserted import goes right before: the first statement that is neither the
    docstring nor a ``__future__`` import (its first decorator, if decorated), or a small
    statement that follows them on their line (``from __future__ import x; import os``)."""
    for position, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            for number, small in enumerate(statement.body):
                if not _is_docstring_or_future(small, first=position == 0 and number == 0):
                    return small if number else statement
            continue
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.decorators:
            return statement.decorators[0]
        return statement
    return None


def import_edit(module: cst.Module, name: str, positions: NodePositions, index: LineIndex) -> Edit:
    newline = newline_of(index.source)
    anchor = import_anchor(module)
    if isinstance(anchor, cst.BaseSmallStatement):  # on the line of a __future__ import
        start = positions.span(anchor).start
        point = Location(start.line, start.column + 1)
        return Edit(point, point, f"import {name}; ")
    if anchor is not None:
        point = Location(positions.span(anchor).start.line, 1)
        return Edit(point, point, f"import {name}{newline}")
    source = index.source
    point = index.end()
    lead = "" if source == "" or source.endswith(("\n", "\r")) else newline
    return Edit(point, point, f"{lead}import {name}{newline}")
