"""Applying text edits to a source string, by (row, column) locations."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from replaylint.lint.findings import Edit, Fix, Location

# The line breaks Python's tokenizer (and libcst) recognise; str.splitlines knows more.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class LineIndex:
    """Converts between (row, column) locations and string offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0] + [match.end() for match in _LINE_BREAK.finditer(source)]

    def offset(self, location: Location) -> int:
        row = min(max(location.row, 1), len(self.starts))
        return min(self.starts[row - 1] + location.column - 1, len(self.source))

    def line(self, row: int) -> str:
        """Row ``row`` without its line break."""
        start = self.starts[row - 1]
        end = self.starts[row] if row < len(self.starts) else len(self.source)
        return self.source[start:end].rstrip("\r\n")

    def end(self) -> Location:
        """The location just past the last character."""
        return Location(len(self.starts), len(self.source) - self.starts[-1] + 1)


def newline_of(source: str) -> str:
    """The file's first line break, so that inserted lines match it (CRLF stays CRLF)."""
    match = _LINE_BREAK.search(source)
    return match.group() if match else "\n"


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    # Two insertions at one point conflict (their order would be arbitrary); a replacement and an
    # insertion at its boundary do not.
    if a[0] == a[1] and b[0] == b[1]:
        return a[0] == b[0]
    return a[0] < b[1] and b[0] < a[1]


def select_compatible(source: str, fixes: Iterable[Fix]) -> list[Fix]:
    """The fixes, in order, that touch no text another chosen fix touches.

    Identical edits (two fixes that both add ``import torch``) are compatible: applied once.
    """
    index = LineIndex(source)
    chosen: list[Fix] = []
    taken: dict[tuple[int, int], str] = {}
    for fix in fixes:
        spans = [
            (index.offset(e.location), index.offset(e.end_location), e.content) for e in fix.edits
        ]
        if all(
            taken.get((start, end)) == content
            or not any(_overlaps((start, end), other) for other in taken)
            for start, end, content in spans
        ):
            chosen.append(fix)
            for start, end, content in spans:
                taken[(start, end)] = content
    return chosen


def apply_edits(source: str, edits: Sequence[Edit]) -> str:
    """Apply non-overlapping edits; identical duplicates are applied once."""
    index = LineIndex(source)
    spans = sorted(
        {(index.offset(e.location), index.offset(e.end_location), e.content) for e in edits},
        reverse=True,
    )
    result = source
    for start, end, content in spans:
        result = result[:start] + content + result[end:]
    return result
