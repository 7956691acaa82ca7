"""Keys written for one ring of one layer: ``f"{name}/{layer}"``, ``f"state.{name}.{layer}"``.

A loop over the rings and their layers keys each entry by the ring's name and the layer's index.
The index is seldom a known string, so the key as a whole is not one; the ring's name is still
there, between separators, with only the unknown index after it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.strings import NO_ENV, Env, string_value
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["keyed_ring"]

# what separates the parts of a key written for one ring of one layer (`f"{name}/{layer}"`)
_KEY_SEPARATORS = re.compile(r"[/.:]")
_UNKNOWN = "\0"


def keyed_ring(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV
) -> str | None:
    """The ring an f-string key names beside parts that are not known strings, a layer index
    among them: ``f"{name}/{i}"`` and ``f"decode_state.{name}.{layer}"`` name the ring ``name``
    holds in this iteration. The ring is the last part between separators (``/``, ``.``,
    ``:``) that is known text and has only unknown parts or numbers after it; None when there
    is none, or when ``expr`` is not such an f-string."""
    if not isinstance(expr, cst.FormattedString):
        return None
    written: list[str] = []
    for part in expr.parts:
        if isinstance(part, cst.FormattedStringText):
            written.append(part.value)
        elif isinstance(part, cst.FormattedStringExpression):
            known = None
            if part.format_spec is None and part.conversion is None:
                known = string_value(prov, part.expression, site, env)
            written.append(_UNKNOWN if known is None or _UNKNOWN in known else known)
        else:
            return None
    if _UNKNOWN not in written:
        return None  # a key known in whole is `string_value`'s
    for segment in reversed(_KEY_SEPARATORS.split("".join(written))):
        if _UNKNOWN in segment:
            if segment.strip(_UNKNOWN):
                return None  # known text joined to an unknown part: no ring's name alone
            continue
        if segment and not segment.isdigit():
            return segment
    return None
