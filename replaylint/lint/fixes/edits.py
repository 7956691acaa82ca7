"""Applying text edits to a source string, by (row, column) locations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from replaylint.lint.model import Edit, Fix, LineIndex


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
