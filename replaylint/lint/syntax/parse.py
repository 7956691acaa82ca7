"""Source text to a libcst module, refusing first what would crash or stall the parser."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.model import SourceError
from replaylint.lint.syntax.limits import ParseLimitError, check_parse_limits
from replaylint.lint.syntax.unvalidated import parse_module


def parse(source: str) -> cst.Module:
    """Parse ``source``; every reason it cannot be linted is a :class:`SourceError`."""
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
