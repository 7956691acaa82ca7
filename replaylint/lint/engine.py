"""The lint engine: parse once, run every enabled rule in one traversal, fix until stable."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

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
from replaylint.lint.prefilter import Relevance
from replaylint.lint.rule import Rule
from replaylint.lint.rules import ALL_RULES
from replaylint.lint.settings import Settings
from replaylint.lint.suppression import parse_suppressions
from replaylint.lint.text_edits import LineIndex, apply_edits, newline_of, select_compatible
from replaylint.lint.traversal import walk

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
        return cst.parse_module(source)
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
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        context = FileContext(filename, wrapper, self.gate_caches, self.settings.entry_points)
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
    positions = context.wrapper.resolve(PositionProvider)
    parents = context.wrapper.resolve(ParentNodeProvider)
    index = LineIndex(source)
    seen: set[tuple[str, int]] = set()
    findings: list[Finding] = []
    for draft in context.drafts:
        key = (draft.code, id(draft.node))
        if key in seen:
            continue
        seen.add(key)
        span = positions[draft.node]
        findings.append(
            Finding(
                code=draft.code,
                message=draft.message,
                filename=context.filename,
                location=Location(span.start.line, span.start.column + 1),
                end_location=Location(span.end.line, span.end.column + 1),
                fix=_fix_from_draft(context, draft, positions, index),
                statement_rows=_statement_rows(draft, positions, parents),
            )
        )
    return findings


Positions = Mapping[cst.CSTNode, CodeRange]


def _statement_rows(
    draft: FindingDraft, positions: Positions, parents: Mapping[cst.CSTNode, cst.CSTNode]
) -> tuple[int, int]:
    """First and last row of the statement (or compound-statement header) holding the node."""
    child: cst.CSTNode = draft.node
    node: cst.CSTNode = draft.node
    while True:
        parent = parents[node]
        if isinstance(parent, cst.SimpleStatementLine):
            span = positions[parent]
            return span.start.line, span.end.line
        if isinstance(parent, cst.BaseCompoundStatement):
            start = positions[parent].start.line
            end = positions[child].end.line
            return start, max(start, end)
        if isinstance(parent, cst.Module):
            span = positions[node]
            return span.start.line, span.end.line
        child, node = node, parent


def _fix_from_draft(
    context: FileContext, draft: FindingDraft, positions: Positions, index: LineIndex
) -> Fix | None:
    fix: FixDraft | None = draft.fix
    if fix is None:
        return None
    edits = tuple(_edit(context, edit, positions, index) for edit in fix.edits)
    return Fix(fix.applicability, fix.message, edits)


def _edit(context: FileContext, edit: EditDraft, positions: Positions, index: LineIndex) -> Edit:
    if isinstance(edit, Replace):
        span = positions[edit.node]
        content = edit.new if isinstance(edit.new, str) else context.module.code_for_node(edit.new)
        return Edit(
            Location(span.start.line, span.start.column + 1),
            Location(span.end.line, span.end.column + 1),
            content,
        )
    if isinstance(edit, InsertAfter):
        end = positions[edit.node].end
        point = Location(end.line, end.column + 1)
        return Edit(point, point, edit.text)
    assert isinstance(edit, AddModuleImport)
    return _import_edit(context.module, edit.module, positions, index)


def _is_docstring_or_future(statement: cst.BaseStatement, first: bool) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if first and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
        return True
    return (
        isinstance(small, cst.ImportFrom)
        and isinstance(small.module, cst.Name)
        and small.module.value == "__future__"
    )


def _import_edit(module: cst.Module, name: str, positions: Positions, index: LineIndex) -> Edit:
    newline = newline_of(index.source)
    for position, statement in enumerate(module.body):
        if not _is_docstring_or_future(statement, first=position == 0):
            start = positions[statement].start
            point = Location(start.line, 1)
            return Edit(point, point, f"import {name}{newline}")
    source = index.source
    point = index.end()
    lead = "" if source == "" or source.endswith(("\n", "\r")) else newline
    return Edit(point, point, f"{lead}import {name}{newline}")
