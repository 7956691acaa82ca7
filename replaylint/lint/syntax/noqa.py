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
# What follows a blanket `# noqa` that was meant to name codes: `# noqa RL001`, `# noqa : RL001`.
_MISSPELT_CODES = re.compile(r"\s*:?\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.I)


@dataclass(frozen=True)
class NoqaProblem:
    """A ``# noqa`` comment that does not do what it seems to: ``row`` and what to write."""

    row: int
    message: str


@dataclass
class Suppressions:
    """Which codes are suppressed on which rows, and file-wide; and comments that misfire."""

    by_row: dict[int, frozenset[str]] = field(default_factory=dict)
    file_wide: frozenset[str] = frozenset()
    problems: list[NoqaProblem] = field(default_factory=list)

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


def may_misfire(source: str, known_prefix: str, known: Iterable[str]) -> bool:
    """Whether :func:`parse_suppressions` may find a problem in ``source``: every comment runs
    from one of its line's ``#`` to the line's end, so checking each such piece of each line
    that mentions ``noqa`` is a superset of checking the comments, without tokenizing the file."""
    known_codes = frozenset(known)
    for line in _lines(source):
        if "noqa" not in line.lower():
            continue
        start = line.find("#")
        while start >= 0:
            if _comment_problems(0, line[start:].rstrip("\n"), known_prefix, known_codes):
                return True
            start = line.find("#", start + 1)
    return False


def _comment_problems(
    row: int, comment: str, known_prefix: str, known: frozenset[str]
) -> list[NoqaProblem]:
    """The problems of one comment that is not file-wide."""
    if _FILE_NOQA.search(comment) is not None:
        return []
    match = _NOQA.search(comment)
    if match is None:
        return []
    return list(_problems(row, comment, match, _codes(match), known_prefix, known))


def parse_suppressions(
    source: str, known_prefix: str = "", known: Iterable[str] = ()
) -> Suppressions:
    """The file's ``# noqa`` comments. A code that starts with ``known_prefix`` but is not one of
    ``known`` is a problem (other tools' codes, ``E501``, are left alone), and so is a blanket
    ``# noqa`` followed by codes without the colon, which suppresses every code on its line."""
    known_codes = frozenset(known)
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
            codes = _codes(match)
            result.by_row[row] = result.by_row.get(row, frozenset()) | codes
            result.problems.extend(_problems(row, comment, match, codes, known_prefix, known_codes))
    result.file_wide = frozenset(file_wide)
    return result


def _problems(
    row: int,
    comment: str,
    match: re.Match[str],
    codes: frozenset[str],
    known_prefix: str,
    known: frozenset[str],
) -> Iterable[NoqaProblem]:
    if codes is _ALL:
        meant = _MISSPELT_CODES.match(comment, match.end())
        if meant is not None:
            written = comment[match.start() : meant.end()].strip()
            wanted = ", ".join(sorted(_codes(meant)))
            yield NoqaProblem(
                row,
                f"`{written}` is a blanket `# noqa`: it suppresses every code on the line; "
                f"write `# noqa: {wanted}` to suppress only {wanted}",
            )
        return
    if known_prefix:
        for code in sorted(codes):
            if code.startswith(known_prefix) and code not in known:
                yield NoqaProblem(
                    row, f"`# noqa` names {code}, which is not a replaylint rule code"
                )
