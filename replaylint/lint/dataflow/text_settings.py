"""Dtype settings that hold a dtype's name as text, not a ``torch.dtype``.

``decay_dtype = os.environ.get("KV_TRANSFER_DECAY_DTYPE", transfer_dtype)`` is a string: an
environment variable's value, and so its default too, is the text a later ``str_to_dtype``
reads. A fix that makes such a setting float32 must write ``"float32"`` there, never
``torch.float32``, which the code that parses the text would reject. A value counts as text when
it is a string literal, a string the analysis can evaluate, an environment read or its default,
or a local bound only to those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.dtype_strings import float32_spelling, string_dtype
from replaylint.lint.syntax.nodes import dotted_name, literal_string
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["float32_text"]

_ENVIRONMENT_READS = frozenset({"os.environ.get", "environ.get", "os.getenv", "getenv"})
_MAX_DEPTH = 4


def float32_text(prov: Provenance, value: cst.BaseExpression, site: Site) -> str | None:
    """``"float32"`` spelled as the setting ``value`` spells dtypes (``"fp32"`` beside
    ``"bf16"``) when ``value`` holds a dtype's name as text; None when it may hold a dtype."""
    texts = _texts(prov, value, site, 0)
    if texts is None and not _env_default(value, site):
        return None
    named = [t for t in texts or () if string_dtype(t) is not None]
    return float32_spelling(named[0]) if named else "float32"


def _env_default(value: cst.BaseExpression, site: Site) -> bool:
    """Whether ``value`` is the default of an environment read in its statement."""
    if site.statement is None:
        return False
    for node in descendants(site.statement):
        if (
            isinstance(node, cst.Call)
            and dotted_name(node.func) in _ENVIRONMENT_READS
            and len(node.args) == 2
            and node.args[1].value is value
        ):
            return True
    return False


def _texts(prov: Provenance, value: cst.BaseExpression, site: Site, depth: int) -> list[str] | None:
    """The texts ``value`` may hold (empty where one is text the analysis cannot read), or None
    when it may be anything but text."""
    if depth > _MAX_DEPTH:
        return None
    literal = literal_string(value)
    if literal is not None:
        return [literal]
    if isinstance(value, cst.Call) and dotted_name(value.func) in _ENVIRONMENT_READS:
        fallback = (
            _texts(prov, value.args[1].value, site, depth + 1) if len(value.args) == 2 else []
        )
        return fallback or []
    if isinstance(value, cst.Subscript) and dotted_name(value.value) in {"os.environ", "environ"}:
        return []
    known = prov.string_value(value, site)
    if known is not None:
        return [known]
    if not isinstance(value, cst.Name):
        return None
    found = prov.lookup(value.value, site)
    if not found:
        return None
    texts: list[str] = []
    for binding, binding_site in found:
        if binding.kind != "assign" or binding.value is None:
            return None
        more = _texts(prov, binding.value, binding_site, depth + 1)
        if more is None:
            return None
        texts.extend(more)
    return texts
