"""Source positions of the few nodes a file's findings need, without whole-tree metadata.

libcst's ``PositionProvider`` and ``ParentNodeProvider`` compute a position and a parent for every
node of a module (whitespace and commas included); on a file with findings they cost several times
the parse. Findings need the spans of a handful of nodes and the statement around each. Both come
from one rendering of the module: libcst's code generator reports every node it enters and leaves
and every syntactic range it opens, so a code-generation state that keeps the chain of nodes being
rendered knows each target's ancestors, and one that notes token counts at the interesting moments
knows their spans. Token counts become (line, column) once, at the end, from the rendered text.
Given the text the module was parsed from, rendering starts at the first top-level statement that
holds a node asked for (a finding near the end of a long file renders only the end).

The spans are exactly ``PositionProvider``'s (same rules for syntactic ranges, hoisted start and
end nodes, and whitespace-inclusive fallbacks); ``tests/lint/test_positions.py`` compares them node
by node on every corpus file.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterable

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

from replaylint.lint.syntax.traversal import syntax_children

__all__ = ["NodePositions"]

_NEWLINE = re.compile(r"\r\n?|\n")  # what libcst counts as a line break
# Once this many separate renderings were needed, record every node in the next one.
_PASSES_BEFORE_RECORDING_ALL = 2


class _Recorder(CodegenState):
    """Renders a module and notes token counts for the nodes in ``wanted`` (or every node)."""

    def __init__(self, module: cst.Module, targets: set[int], *, record_all: bool) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.targets = targets
        self.wanted = set(targets)
        self.record_all = record_all
        self.path: list[cst.CSTNode] = []
        self.starts: list[int] = []
        self.ranges: dict[int, tuple[int, int]] = {}
        # Syntactic ranges of the nodes being rendered: a node may turn out to be wanted only
        # after its range closed (a target in the whitespace after an operator, say).
        self.syntactic: dict[int, tuple[int, int]] = {}
        # For each target: (statement-like ancestor, node under it, the "child" it ends at).
        self.statements: dict[int, tuple[cst.CSTNode, cst.CSTNode, cst.CSTNode]] = {}

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.path.append(node)
        self.starts.append(len(self.tokens))
        if id(node) in self.targets:
            self._note_statement(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.starts.pop()
        self.path.pop()
        key = id(node)
        syntactic = self.syntactic.pop(key, None)
        if self.record_all or key in self.wanted:
            # Without a syntactic range, libcst's position includes the node's whitespace.
            self.ranges[key] = syntactic or (start, len(self.tokens))

    def pop_trailing_newline(self) -> None:
        # Keep the token: spans already recorded count it, as libcst's own positions do.
        pass

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _SyntacticRange:
        # Hoisted ends are children rendered inside this range: make sure they are recorded.
        if start_node is not None:
            self.wanted.add(id(start_node))
        if end_node is not None:
            self.wanted.add(id(end_node))
        return _SyntacticRange(self, node, start_node, end_node)

    def _note_statement(self, node: cst.CSTNode) -> None:
        """Find the statement around ``node`` the way a walk up its parents would."""
        path = self.path
        deepest = len(path) - 1
        for index in range(deepest - 1, -1, -1):
            parent = path[index]
            if isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Module)):
                under = path[index + 1]
                # The row range of a compound statement ends with the node two levels below it
                # on the way down (one level when the target is directly under it).
                child = path[min(index + 2, deepest)]
                self.statements[id(node)] = (parent, under, child)
                self.wanted.update((id(parent), id(under), id(child)))
                return


class _SyntacticRange:
    """The context in which libcst renders a node's syntactic part (a class, not a generator:
    it is entered for most nodes of the module)."""

    __slots__ = ("end_node", "node", "recorder", "start", "start_node")

    def __init__(
        self,
        recorder: _Recorder,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.recorder = recorder
        self.node = node
        self.start_node = start_node
        self.end_node = end_node
        self.start = 0

    def __enter__(self) -> None:
        self.start = len(self.recorder.tokens)

    def __exit__(self, *_: object) -> None:
        recorder = self.recorder
        ranges = recorder.ranges
        start_node, end_node = self.start_node, self.end_node
        first = ranges[id(start_node)][0] if start_node is not None else self.start
        last = ranges[id(end_node)][1] if end_node is not None else len(recorder.tokens)
        recorder.syntactic[id(self.node)] = (first, last)


class NodePositions:
    """Spans and statement rows of nodes of one module, computed on demand.

    Given the module's ``source`` (the text it was parsed from, which libcst renders back
    exactly), a rendering starts at the first top-level statement that holds a node asked for,
    not at the top of the file: the text after that point fixes where it starts.
    """

    def __init__(self, module: cst.Module, source: str | None = None) -> None:
        self._module = module
        self._source = source
        self._spans: dict[int, CodeRange] = {}
        self._statement_rows: dict[int, tuple[int, int]] = {}
        self._passes = 0

    def span(self, node: cst.CSTNode) -> CodeRange:
        """``node``'s syntactic range, as libcst's ``PositionProvider`` gives it."""
        if id(node) not in self._spans:
            self.compute([node])
        return self._spans[id(node)]

    def statement_rows(self, node: cst.CSTNode) -> tuple[int, int]:
        """First and last row of the statement (or compound-statement header) holding ``node``."""
        if id(node) not in self._statement_rows:
            self.compute([node])
        return self._statement_rows[id(node)]

    def compute(self, nodes: Iterable[cst.CSTNode]) -> None:
        """Compute spans and statement rows of ``nodes`` in one rendering of the module."""
        targets = [node for node in nodes if id(node) not in self._statement_rows]
        missing = {id(node) for node in targets}
        if not missing:
            return
        self._passes += 1
        record_all = self._passes > _PASSES_BEFORE_RECORDING_ALL
        recorder, first_line = None, 1
        if self._source is not None and not record_all:
            first = _first_statement_holding(self._module, missing)
            if first is not None and first > 0:
                recorder = _Recorder(self._module, missing, record_all=False)
                found = _render_from(self._module, first, recorder, self._source)
                recorder, first_line = (recorder, found) if found is not None else (None, 1)
        if recorder is None:
            recorder = _Recorder(self._module, missing, record_all=record_all)
            self._module._codegen(recorder)
        unreached = missing - recorder.statements.keys()
        if unreached:
            raise KeyError(f"{len(unreached)} node(s) are not part of the module")
        locate = _Locator(recorder.tokens, first_line)
        ranges, spans = recorder.ranges, self._spans

        def span(node: cst.CSTNode) -> CodeRange:
            key = id(node)
            found = spans.get(key)
            if found is None:
                first, last = ranges[key]
                found = spans[key] = CodeRange(locate(first), locate(last))
            return found

        for key, (parent, under, child) in recorder.statements.items():
            self._statement_rows[key] = _rows(span, parent, under, child)
        for node in targets:
            span(node)
        if recorder.record_all:  # keep them all for later questions
            for key in ranges.keys() - spans.keys():
                first, last = ranges[key]
                spans[key] = CodeRange(locate(first), locate(last))


def _first_statement_holding(module: cst.Module, wanted: set[int]) -> int | None:
    """The index of the first top-level statement from which on every wanted node lies (searched
    from the end); None when some wanted node is not found below a statement."""
    remaining = set(wanted)
    body = module.body
    for index in range(len(body) - 1, -1, -1):
        stack: list[cst.CSTNode] = [body[index]]
        while stack:
            node = stack.pop()
            remaining.discard(id(node))
            stack.extend(syntax_children(node))
        if not remaining:
            return index
    return None


def _render_from(module: cst.Module, first: int, recorder: _Recorder, source: str) -> int | None:
    """Render ``module.body[first:]`` and the footer; the line they start on in ``source``, or
    None when ``source`` does not end with that text (then the whole module is rendered)."""
    recorder.path.append(module)
    recorder.starts.append(0)
    for statement in module.body[first:]:
        statement._codegen(recorder)
    for line in module.footer:
        line._codegen(recorder)
    tokens = recorder.tokens
    # The module drops its last newline when the file has none; the recorder keeps it.
    kept = tokens[:-1] if tokens and not module.has_trailing_newline else tokens
    tail = "".join(kept)
    if not tail or not source.endswith(tail):
        return None
    offset = len(source) - len(tail)
    if offset and source[offset - 1] not in "\r\n":
        return None  # a statement starts a line: anything else means the text is not the tree's
    breaks = (
        source.count("\n", 0, offset)
        + source.count("\r", 0, offset)
        - source.count("\r\n", 0, offset)
    )
    return breaks + 1


def _rows(
    span: Callable[[cst.CSTNode], CodeRange],
    parent: cst.CSTNode,
    under: cst.CSTNode,
    child: cst.CSTNode,
) -> tuple[int, int]:
    if isinstance(parent, cst.SimpleStatementLine):
        found = span(parent)
        return found.start.line, found.end.line
    if isinstance(parent, cst.BaseCompoundStatement):
        start = span(parent).start.line
        return start, max(start, span(child).end.line)
    found = span(under)  # directly under the module
    return found.start.line, found.end.line


class _Locator:
    """Token count -> (line, column) in the text the tokens render, which starts at the start of
    line ``first_line`` of the file."""

    def __init__(self, tokens: list[str], first_line: int = 1) -> None:
        self._offsets = list(itertools.accumulate(map(len, tokens), initial=0))
        text = "".join(tokens)
        self._line_starts = [0, *(match.end() for match in _NEWLINE.finditer(text))]
        self._lines_before = first_line - 1

    def __call__(self, token_count: int) -> CodePosition:
        offset = self._offsets[token_count]
        line = bisect.bisect_right(self._line_starts, offset)
        return CodePosition(self._lines_before + line, offset - self._line_starts[line - 1])
