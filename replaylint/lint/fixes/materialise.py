"""From drafts to findings: locate each reported node and turn its fix into text edits.

Runs only for files with findings: one rendering of the module gives every span the findings and
their fixes need. Two drafts of one code at one node are one finding.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from replaylint.lint.fixes.drafts import (
    AddModuleImport,
    EditDraft,
    FindingDraft,
    InsertAfter,
    InsertLineAfter,
    Replace,
)
from replaylint.lint.fixes.imports import import_anchor, import_edit
from replaylint.lint.model import Edit, Finding, Fix, LineIndex, Location, newline_of
from replaylint.lint.syntax.positions import NodePositions


def materialise(
    filename: str,
    module: cst.Module,
    positions: NodePositions,
    finding_drafts: Sequence[FindingDraft],
    source: str,
) -> list[Finding]:
    """The findings ``finding_drafts`` describe, located in ``source``."""
    drafts: list[FindingDraft] = []
    seen: set[tuple[str, int]] = set()
    for draft in finding_drafts:
        key = (draft.code, id(draft.node))
        if key not in seen:
            seen.add(key)
            drafts.append(draft)
    positions.compute(_nodes_to_locate(module, drafts))
    index = LineIndex(source)
    findings: list[Finding] = []
    for draft in drafts:
        span = positions.span(draft.node)
        findings.append(
            Finding(
                code=draft.code,
                message=draft.message,
                filename=filename,
                location=Location(span.start.line, span.start.column + 1),
                end_location=Location(span.end.line, span.end.column + 1),
                fix=_fix_from_draft(module, draft, positions, index),
                statement_rows=positions.statement_rows(draft.node),
            )
        )
    return findings


def _nodes_to_locate(module: cst.Module, drafts: Sequence[FindingDraft]) -> list[cst.CSTNode]:
    nodes: list[cst.CSTNode] = []
    for draft in drafts:
        nodes.append(draft.node)
        for edit in draft.fix.edits if draft.fix is not None else ():
            if isinstance(edit, (Replace, InsertAfter, InsertLineAfter)):
                nodes.append(edit.node)
            elif (statement := import_anchor(module)) is not None:
                nodes.append(statement)
    return nodes


def _fix_from_draft(
    module: cst.Module, draft: FindingDraft, positions: NodePositions, index: LineIndex
) -> Fix | None:
    fix = draft.fix
    if fix is None:
        return None
    edits = tuple(_edit(module, edit, positions, index) for edit in fix.edits)
    return Fix(fix.applicability, fix.message, edits)


def _edit(module: cst.Module, edit: EditDraft, positions: NodePositions, index: LineIndex) -> Edit:
    if isinstance(edit, Replace):
        span = positions.span(edit.node)
        content = edit.new if isinstance(edit.new, str) else module.code_for_node(edit.new)
        return Edit(
            Location(span.start.line, span.start.column + 1),
            Location(span.end.line, span.end.column + 1),
            content,
        )
    if isinstance(edit, InsertAfter):
        end = positions.span(edit.node).end
        point = Location(end.line, end.column + 1)
        return Edit(point, point, edit.text)
    if isinstance(edit, InsertLineAfter):
        span = positions.span(edit.node)
        first = index.line(span.start.line)
        indent = first[: len(first) - len(first.lstrip(" \t"))]
        newline = newline_of(index.source)
        line = f"{indent}{edit.text}{newline}"
        if span.end.line >= len(index.starts):  # the last line, with no line break after it
            last = index.end()
            return Edit(last, last, newline + line)
        point = Location(span.end.line + 1, 1)
        return Edit(point, point, line)
    assert isinstance(edit, AddModuleImport)
    return import_edit(module, edit.module, positions, index)
