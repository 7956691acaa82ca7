"""Parse with libcst without re-validating every node the parser builds.

Every libcst node validates itself when constructed (``CSTNode.__post_init__`` calls
``_validate``: whitespace shape, balanced parentheses, ...). That protects trees that code builds
by hand; the parser's own output is valid by construction, and re-checking it costs about a fifth
of the parse (libcst's own source notes the same). So while the parser runs, construction skips
the check; nodes built afterwards (fixes) are validated as usual.

The switch is made only when ``__post_init__`` is still exactly "call ``_validate``": should a
libcst release give it more to do, parsing falls back to the validated path.
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.base import CSTNode

__all__ = ["parse_module"]

_VALIDATING_INIT = CSTNode.__post_init__


def _skip_validation(self: CSTNode) -> None:
    pass


def _only_validates(function: object) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and code.co_names == ("_validate",)


# Defined on CSTNode itself (no node class overrides it) and doing nothing but validate.
_CAN_SKIP = "__post_init__" in CSTNode.__dict__ and _only_validates(_VALIDATING_INIT)


def parse_module(source: str) -> cst.Module:
    """``libcst.parse_module(source)``, without validating the parser's output."""
    if not _CAN_SKIP:
        return cst.parse_module(source)
    CSTNode.__post_init__ = _skip_validation  # type: ignore[method-assign]
    try:
        return cst.parse_module(source)
    finally:
        CSTNode.__post_init__ = _VALIDATING_INIT  # type: ignore[method-assign]
