"""The lint engine: parse once, run every enabled rule in one traversal, fix until stable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from replaylint.lint.context import (
    AddModuleImport,
    EditDraft,
    FileContext,
    FindingDraft,
    FixDraft,
    InsertAfter,
    Replace,
)
from replaylint.lint.findings import Applicability, Edit, Finding, Fix, Location
from replaylint.lint.gate_caches import GateCacheNames
from replaylint.lint.learning import learn_gate_cache_names
from replaylint.lint.parse_limits import ParseLimitError, check_parse_limits
from replaylint.lint.positions import NodePositions
from replaylint.lint.prefilter import Relevance
from replaylint.lint.rule import Rule
from replaylint.lint.rules import ALL_RULES
from replaylint.lint.settings import Settings
from replaylint.lint.suppression import parse_suppressions
from replaylint.lint.text_edits import LineIndex, apply_edits, newline_of, select_compatible
from replaylint.lint.traversal import walk
from replaylint.lint.unvalidated_parse import parse_module

MAX_FIX_ITERATIONS = 10


class SourceError(Exception):
    """A file that cannot be linted: its text is not Python we can parse."""

    def __init__(self, message: str, row: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.row = row
        self.column = column


@dataclass(frozen=True)
class FixResult:
    """The outcome of fixing one source text."""

    source: str
    remaining: tuple[Finding, ...]
    applied: int
    dropped: tuple[Finding, ...] = field(default=())
    """Findings whose fix was not applied because the result did not parse (an internal bug)."""


def parse(source: str) -> cst.Module:
    try:
        check_parse_limits(source)  # libcst crashes on some inputs: refuse those first
        return parse_module(source)
    except ParseLimitError as error:
        raise SourceError(str(error)) from None
    except cst.ParserSyntaxError as error:
        raise SourceError(
            f"syntax error: {error.message}", error.raw_line, error.raw_column + 1
        ) from None
    except RecursionError:
        raise SourceError("the file is nested too deeply to analyse") from None


class Linter:
    """Runs a fixed set of rules over source texts."""

    def __init__(
        self,
        settings: Settings | None = None,
        rules: Sequence[type[Rule]] = ALL_RULES,
        gate_caches: GateCacheNames | None = None,
        *,
        prefilter: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.rules = tuple(rule for rule in rules if self.settings.is_enabled(rule.CODE))
        self.prefilter = prefilter
        self.gate_caches = gate_caches or GateCacheNames(self.settings.gate_cache_patterns)

    @property
    def gate_caches(self) -> GateCacheNames:
        return self._gate_caches

    @gate_caches.setter
    def gate_caches(self, names: GateCacheNames) -> None:
        self._gate_caches = names
        self.relevance = Relevance(names, self.settings.entry_points)

    def learn(self, sources: Iterable[tuple[str, str]]) -> GateCacheNames:
        """The first pass of a run: learn gate-cache names from decode entry-point calls.

        ``sources`` are (filename, text) pairs — every file of the run, or just the stdin text.
        Whatever is passed as an entry point's gate-cache argument becomes a gate-cache name for
        the checks that follow (see :mod:`replaylint.lint.learning`). Returns the names now used.
        """
        learned = learn_gate_cache_names(sources, self.settings.entry_points, self.gate_caches)
        if learned:
            self.gate_caches = self.gate_caches.with_learned(learned)
        return self.gate_caches

    def rules_for(self, filename: str) -> tuple[type[Rule], ...]:
        ignored = self.settings.ignored_for_file(Path(filename))
        if not ignored:
            return self.rules
        return tuple(r for r in self.rules if not any(r.CODE.startswith(i) for i in ignored))

    def check(self, source: str, filename: str = "<stdin>") -> list[Finding]:
        """Findings in ``source``, noqa-suppressed ones removed, sorted by position."""
        rules = self.rules_for(filename)
        if not rules or (self.prefilter and not self.relevance.may_hold_finding(source)):
            return []
        module = parse(source)
        context = FileContext(
            filename, module, self.gate_caches, self.settings.entry_points, source=source
        )
        try:
            walk(module, [rule(context) for rule in rules])
        except RecursionError:
            raise SourceError("the file is nested too deeply to analyse") from None
        if not context.drafts:
            return []
        findings = _materialise(context, source)
        suppressions = parse_suppressions(source)
        return sorted((f for f in findings if not suppressions.suppresses(f)), key=Finding.sort_key)

    def fix(self, source: str, filename: str = "<stdin>", *, unsafe: bool = False) -> FixResult:
        """Apply fixes until none is left (bounded); never returns unparsable source."""
        allowed = {Applicability.SAFE, Applicability.UNSAFE} if unsafe else {Applicability.SAFE}
        current = source
        applied = 0
        dropped: list[Finding] = []
        broken_codes: set[str] = set()  # a fix that broke the file once is not offered again
        findings = self.check(current, filename)
        for _ in range(MAX_FIX_ITERATIONS):
            candidates = [
                f
                for f in findings
                if f.fix is not None
                and f.fix.applicability in allowed
                and f.code not in broken_codes
            ]
            if not candidates:
                break
            chosen = select_compatible(current, [f.fix for f in candidates if f.fix])
            updated, good = _apply_checked(current, chosen)
            for finding in candidates:
                if finding.fix in chosen and finding.fix not in good:
                    dropped.append(finding)
                    broken_codes.add(finding.code)
            if updated == current:
                break
            applied += len(good)
            current = updated
            findings = self.check(current, filename)
        return FixResult(current, tuple(findings), applied, tuple(dropped))


def _parses(source: str) -> bool:
    try:
        parse(source)
    except SourceError:
        return False
    return True


def _apply_checked(source: str, fixes: list[Fix]) -> tuple[str, list[Fix]]:
    """Apply ``fixes`` together; if the result does not parse, keep only those that parse alone."""
    if not fixes:
        return source, []
    combined = apply_edits(source, [edit for fix in fixes for edit in fix.edits])
    if _parses(combined):
        return combined, fixes
    good = [fix for fix in fixes if _parses(apply_edits(source, fix.edits))]
    if not good:
        return source, []
    combined = apply_edits(source, [edit for fix in good for edit in fix.edits])
    return (combined, good) if _parses(combined) else (source, [])


def _materialise(context: FileContext, source: str) -> list[Finding]:
    positions = context.positions
    drafts: list[FindingDraft] = []
    seen: set[tuple[str, int]] = set()
    for draft in context.drafts:
        key = (draft.code, id(draft.node))
        if key not in seen:
            seen.add(key)
            drafts.append(draft)
    # One rendering of the module gives every span the findings and their fixes need.
    positions.compute(_nodes_to_locate(context.module, drafts))
    index = LineIndex(source)
    findings: list[Finding] = []
    for draft in drafts:
        span = positions.span(draft.node)
        findings.append(
            Finding(
                code=draft.code,
                message=draft.message,
                filename=context.filename,
                location=Location(span.start.line, span.start.column + 1),
                end_location=Location(span.end.line, span.end.column + 1),
                fix=_fix_from_draft(context, draft, positions, index),
                statement_rows=positions.statement_rows(draft.node),
            )
        )
    return findings


def _nodes_to_locate(module: cst.Module, drafts: Sequence[FindingDraft]) -> list[cst.CSTNode]:
    nodes: list[cst.CSTNode] = []
    for draft in drafts:
        nodes.append(draft.node)
        for edit in draft.fix.edits if draft.fix is not None else ():
            if isinstance(edit, (Replace, InsertAfter)):
                nodes.append(edit.node)
            elif (statement := _import_anchor(module)) is not None:
                nodes.append(statement)
    return nodes


def _fix_from_draft(
    context: FileContext, draft: FindingDraft, positions: NodePositions, index: LineIndex
) -> Fix | None:
    fix: FixDraft | None = draft.fix
    if fix is None:
        return None
    edits = tuple(_edit(context, edit, positions, index) for edit in fix.edits)
    return Fix(fix.applicability, fix.message, edits)


def _edit(
    context: FileContext, edit: EditDraft, positions: NodePositions, index: LineIndex
) -> Edit:
    if isinstance(edit, Replace):
        span = positions.span(edit.node)
        content = edit.new if isinstance(edit.new, str) else context.module.code_for_node(edit.new)
        return Edit(
            Location(span.start.line, span.start.column + 1),
            Location(span.end.line, span.end.column + 1),
            content,
        )
    if isinstance(edit, InsertAfter):
        end = positions.span(edit.node).end
        point = Location(end.line, end.column + 1)
        return Edit(point, point, edit.text)
    assert isinstance(edit, AddModuleImport)
    return _import_edit(context.module, edit.module, positions, index)


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


def _import_anchor(module: cst.Module) -> cst.CSTNode | None:
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


def _import_edit(module: cst.Module, name: str, positions: NodePositions, index: LineIndex) -> Edit:
    newline = newline_of(index.source)
    anchor = _import_anchor(module)
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
