"""``# noqa`` comments: per statement, per code, and file-wide ``# replaylint: noqa``."""

from __future__ import annotations

import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field

from replaylint.lint.model import Finding

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)
_FILE_NOQA = re.compile(
    r"#\s*replaylint\s*:\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I
)
_ALL = frozenset({"*"})


@dataclass
class Suppressions:
    """Which codes are suppressed on which rows, and file-wide."""

    by_row: dict[int, frozenset[str]] = field(default_factory=dict)
    file_wide: frozenset[str] = frozenset()

    def suppresses(self, finding: Finding) -> bool:
        if _covers(self.file_wide, finding.code):
            return True
        first, last = finding.statement_rows
        rows = (
            range(first, last + 1)
            if first
            else range(finding.location.row, finding.location.row + 1)
        )
        return any(_covers(self.by_row.get(row, frozenset()), finding.code) for row in rows)


def _covers(codes: frozenset[str], code: str) -> bool:
    return "*" in codes or code in codes


def _codes(match: re.Match[str]) -> frozenset[str]:
    if match.group("codes") is None:
        return _ALL
    return frozenset(c.upper() for c in re.split(r"[\s,]+", match.group("codes")) if c)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _lines(source: str) -> list[str]:
    """The source's lines as libcst (and the findings' rows) count them: ``\r\n``, ``\r`` and
    ``\n`` each end a line; each line ends in ``\n`` for the tokenizer."""
    return [line.rstrip("\r\n") + "\n" for line in _LINE.findall(source)]


def _comments(source: str) -> Iterable[tuple[int, str, bool]]:
    """(row, comment, whether the comment is alone on its line) for every comment."""
    lines = _lines(source)
    try:
        for token in tokenize.generate_tokens(iter(lines).__next__):
            if token.type == tokenize.COMMENT:
                own_line = not token.line[: token.start[1]].strip()
                yield token.start[0], token.string, own_line
    except (tokenize.TokenError, SyntaxError):
        # The file parsed with libcst; fall back to a line scan if the tokenizer disagrees.
        for row, line in enumerate(lines, start=1):
            if "#" in line:
                yield row, line[line.index("#") :], line.lstrip().startswith("#")


def parse_suppressions(source: str) -> Suppressions:
    result = Suppressions()
    if "noqa" not in source.lower():
        return result
    file_wide: set[str] = set()
    for row, comment, own_line in _comments(source):
        file_match = _FILE_NOQA.search(comment)
        if file_match is not None:
            # Only on a line of its own, as in ruff: one trailing a statement is ignored rather
            # than silencing the whole file.
            if own_line:
                file_wide |= _codes(file_match)
            continue
        match = _NOQA.search(comment)
        if match is not None:
            result.by_row[row] = result.by_row.get(row, frozenset()) | _codes(match)
    result.file_wide = frozenset(file_wide)
    return result
