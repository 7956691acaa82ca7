"""Sources too large or too deeply nested for libcst, refused before libcst sees them.

libcst's native parser recurses on the machine stack and builds its tree in memory. Measured
(libcst 1.x, Python 3.11, 2 busy cores): nested brackets kill the process (SIGSEGV, nothing to
catch) from 1,202 nested calls, 1,234 lists or 1,281 parentheses, and cost 11 s and 2.2 GB at
1,000 nested calls; long chains crash it too (``a + b + ...`` at 7,000 terms after 131 s at
6,000; ``a and b and ...`` by 10,000; ``- - ... 1`` at 8,000) or crawl (``a[0][0]...``: 2.6 s at
1,000 terms, 39 s at 3,000). A whole file costs it about 0.5 GB of memory and 10 s per MB.

So before parsing, a cheap scan measures what matters and turns a file past a limit into a clear
per-file error, and the run goes on with the other files:

* size: at most :data:`MAX_SOURCE_CHARS` characters;
* bracket depth: at most :data:`MAX_BRACKET_DEPTH`, CPython's own limit, so no valid Python file
  is refused for it;
* expression depth: a logical line with more than half :data:`MAX_EXPRESSION_DEPTH` operators may
  hold a chain that deep; only then is the file parsed with :mod:`ast` (whose recursion limits
  raise cleanly) to measure the real depth of its syntax tree.

The scan respects comments and strings well enough that a bracket or operator inside either does
not count; when it is unsure it overestimates, which only costs the exact :mod:`ast` check (about
a quarter of libcst's parse time when it runs; the scan alone costs 1-4% of it).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = [
    "MAX_BRACKET_DEPTH",
    "MAX_EXPRESSION_DEPTH",
    "MAX_SOURCE_CHARS",
    "ParseLimitError",
    "check_parse_limits",
    "too_large",
]

MAX_BRACKET_DEPTH = 200
"""CPython's tokenizer refuses more nested brackets ("too many nested parentheses"); libcst
crashes from about 1,200 on."""
MAX_EXPRESSION_DEPTH = 400
"""Depth of the syntax tree (:mod:`ast` nodes from the module down). libcst's native parser crashes
at about 7,000 chained operators, but its Python code generation, which the linter needs, recurses
two frames per level and exceeds Python's default recursion limit (1,000) from about 500."""
_CHECK_TREE_ABOVE = MAX_EXPRESSION_DEPTH // 2
"""Operators on one logical line above which the tree is measured: statements nest too (up to
100 blocks), so a line with fewer operators than the limit may still reach it."""
_UNMEASURED_OPERATORS = 1000
"""Operators on one line of a file :mod:`ast` cannot parse that libcst may still be given: far
from its crash (about 7,000) and at most seconds."""
MAX_SOURCE_CHARS = 1_000_000
"""libcst needs about 0.6 GB of memory and 10 s for a 1 MB file (1.1 GB and 39 s for 2 MB)."""

_SKIPPED = "replaylint skipped it"
_INTERESTING = re.compile(r"[#'\"()\[\]{}\r\n\\]")
_NEWLINE = re.compile(r"[\r\n]")
# Everything that can add a level to an expression's tree: an upper bound for one logical line.
_OPERATOR = re.compile(r"[-+*/%@&|^~<>.(\[]|\b(?:and|or|not|if|lambda|await)\b")
_SINGLE_QUOTED = {
    quote: re.compile(rf"(?:[^{quote}\\\r\n]|\\(?:\r\n|[\s\S]))*{quote}?") for quote in "'\""
}


class ParseLimitError(Exception):
    """The source is past a parse limit; the message says which, by how much, and where."""


@dataclass
class _Scan:
    bracket_depth: int = 0
    deepest_at: int = 0
    longest_chain: int = 0
    """The most operators on one logical line (an upper bound of its expressions' depth)."""


def too_large(text: str) -> str | None:
    """Why ``text`` is too large to parse, or None when it is not."""
    if len(text) <= MAX_SOURCE_CHARS:
        return None
    return (
        f"is too large for the parser ({len(text) / 1e6:.1f} MB > limit "
        f"{MAX_SOURCE_CHARS / 1e6:.0f} MB); {_SKIPPED}"
    )


def check_parse_limits(text: str) -> None:
    """Raise :class:`ParseLimitError` when libcst must not be given ``text``."""
    reason = too_large(text)
    if reason is not None:
        raise ParseLimitError(reason)
    scan = _scan(text)
    if scan.bracket_depth > MAX_BRACKET_DEPTH:
        row = text.count("\n", 0, scan.deepest_at) + 1
        raise ParseLimitError(
            f"is too deeply nested for the parser (bracket depth {scan.bracket_depth} > limit "
            f"{MAX_BRACKET_DEPTH}, line {row}); {_SKIPPED}"
        )
    if scan.longest_chain > _CHECK_TREE_ABOVE:
        _check_tree_depth(text, scan.longest_chain)


def _scan(text: str) -> _Scan:
    """Bracket depth and operators per logical line, skipping comments and strings."""
    scan = _Scan()
    depth = 0
    position = 0
    line_start = 0
    skipped: list[tuple[int, int]] = []  # the current logical line's strings and comments
    end = len(text)
    while True:
        found = _INTERESTING.search(text, position)
        if found is None:
            break
        at = found.start()
        char = text[at]
        position = at + 1
        if char in "([{":
            depth += 1
            if depth > scan.bracket_depth:
                scan.bracket_depth, scan.deepest_at = depth, at
        elif char in ")]}":
            depth = max(0, depth - 1)  # unbalanced: a syntax error libcst reports
        elif char in "\r\n":
            if depth == 0:
                _end_logical_line(scan, text, line_start, at, skipped)
                line_start = position
                skipped = []
        elif char == "#":
            newline = _NEWLINE.search(text, at)
            position = end if newline is None else newline.start()
            skipped.append((at, position))
        elif char == "\\":  # an escaped newline continues the logical line
            position = at + (3 if text.startswith("\r\n", at + 1) else 2)
        else:
            position = _string_end(text, at)
            skipped.append((at, position))
    _end_logical_line(scan, text, line_start, end, skipped)
    return scan


def _end_logical_line(
    scan: _Scan, text: str, start: int, stop: int, skipped: list[tuple[int, int]]
) -> None:
    """Count the line's operators outside strings and comments, plus one per string (adjacent
    strings concatenate, one level each)."""
    code = stop - start - sum(b - a for a, b in skipped)
    # A line with less code than the threshold cannot hold more operators: no need to count.
    if code + len(skipped) <= max(_CHECK_TREE_ABOVE, scan.longest_chain):
        return
    operators = len(skipped)
    piece_start = start
    for skip_start, skip_stop in [*skipped, (stop, stop)]:
        operators += sum(1 for _ in _OPERATOR.finditer(text, piece_start, skip_start))
        piece_start = skip_stop
    scan.longest_chain = max(scan.longest_chain, operators)


def _string_end(text: str, at: int) -> int:
    """The position after the string literal whose opening quote is at ``at``."""
    quote = text[at]
    if text.startswith(quote * 3, at):
        closing = quote * 3
        search = at + 3
        while True:
            found = text.find(closing, search)
            if found < 0:
                return len(text)  # unterminated: the rest is the string (a syntax error)
            backslashes = 0
            while text[found - 1 - backslashes] == "\\":
                backslashes += 1
            if backslashes % 2 == 0:
                return found + 3
            search = found + 1
    match = _SINGLE_QUOTED[quote].match(text, at + 1)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _check_tree_depth(text: str, operators: int) -> None:
    """The exact check for a file with a long logical line: the depth of Python's syntax tree."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        # No tree to measure. Up to _UNMEASURED_OPERATORS libcst is safe and fast enough to report
        # the syntax error itself; past that, do not risk it.
        if operators <= _UNMEASURED_OPERATORS:
            return
        where = f"line {error.lineno}: " if error.lineno is not None else ""
        raise ParseLimitError(
            f"has a logical line too long for the parser to check safely ({operators} > "
            f"{_UNMEASURED_OPERATORS} operators) and Python reports a syntax error ({where}"
            f"{error.msg}); {_SKIPPED}"
        ) from None
    except (RecursionError, MemoryError) as error:
        raise ParseLimitError(
            f"is too deeply nested for the parser (Python's own parser gives up: "
            f"{type(error).__name__}; limit {MAX_EXPRESSION_DEPTH}); {_SKIPPED}"
        ) from None
    depth, row = _tree_depth(tree)
    if depth > MAX_EXPRESSION_DEPTH:
        raise ParseLimitError(
            f"is too deeply nested for the parser (expression depth {depth} > limit "
            f"{MAX_EXPRESSION_DEPTH}, line {row}); {_SKIPPED}"
        )


def _tree_depth(tree: ast.AST) -> tuple[int, int]:
    """The deepest node's depth and line, walked without recursion."""
    deepest, row = 0, 1
    stack: list[tuple[ast.AST, int, int]] = [(tree, 0, 1)]
    while stack:
        node, depth, line = stack.pop()
        line = getattr(node, "lineno", line)
        if depth > deepest:
            deepest, row = depth, line
        # ast keeps `a and b and c` flat; libcst nests one level per operator.
        step = len(node.values) if isinstance(node, ast.BoolOp) else 1
        stack.extend((child, depth + step, line) for child in ast.iter_child_nodes(node))
    return deepest, row
