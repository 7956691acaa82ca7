"""Per-ring dtype tables keyed by the rings' words, for RL001: ``{"ring": "float16", "log_decay":
"float16"}`` and ``{"delta": torch.bfloat16, "key": torch.bfloat16, "gate": torch.bfloat16}``.

A dict literal whose every value is a dtype (a torch dtype or a string naming one) and whose keys
name rings is a table of ring dtypes, whatever it is nested in (``RING_PRECISION[mode]``). Its
gate entry is the one keyed by the gate's word: ``log_decay``, ``decay``, ``forget``,
``log_alpha`` on their own, or ``gate``, ``g``, ``alpha`` beside entries for the d and the k
ring (a router's ``gate`` beside ``experts`` is no ring's). An entry keyed by a gate-cache name
with a torch dtype is an allocation's dtype, reported as such; keys named for the gate dtype
(``gate_dtype``) are settings, reported by :mod:`.config_settings`.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.dtype_strings import float32_spelling, string_dtype
from replaylint.lint.dataflow.torch_api import dtype_from_qualified_name
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.gatecache.names import TABLE_GATE_WORDS, TABLE_SHARED_WORDS
from replaylint.lint.gatecache.siblings import D_WORDS, K_WORDS
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.config_settings import string_fix
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.nodes import literal_string
from replaylint.lint.syntax.traversal import descendants

__all__ = ["RING_WORD_INVALID", "RING_WORD_VALID", "ring_word_entries"]

_WIDE = frozenset({"float32", "float64"})


def ring_word_entries(
    rule: Rule, root: cst.Dict
) -> list[tuple[cst.BaseExpression, str, FixDraft | None]]:
    """The findings for the gate entry of each per-ring dtype table in ``root`` (nested tables
    included) that names a dtype narrower than float32: the entry's value, the message, the
    fix. The rule reports those no allocation that reads the entry is reported for."""
    found: list[tuple[cst.BaseExpression, str, FixDraft | None]] = []
    for table in (root, *(n for n in descendants(root) if isinstance(n, cst.Dict))):
        entry = _gate_entry(rule, table)
        if entry is None:
            continue
        key, value, dtype = entry
        if dtype in _WIDE or dtype is None:
            continue
        text = literal_string(value)
        given = (
            f'"{text}" ({literal_names([dtype])})' if text is not None else literal_names([dtype])
        )
        message = f"`{key}`, the gate ring's entry of a table of ring dtypes, is {given}; {WHY}"
        found.append((value, message, _fix(rule, value, text)))
    return found


def _gate_entry(rule: Rule, table: cst.Dict) -> tuple[str, cst.BaseExpression, str | None] | None:
    """The gate entry of ``table`` when it is a per-ring dtype table: its key, its value and
    the dtype it names."""
    entries: list[tuple[str, cst.BaseExpression, str | None]] = []
    for element in table.elements:
        if not isinstance(element, cst.DictElement):
            return None
        key = literal_string(element.key)
        if key is None:
            return None
        dtype = _dtype_of(rule, element.value)
        if dtype is None:
            return None  # not every value is a dtype: no table of dtypes
        entries.append((key, element.value, dtype))
    if len(entries) < 2:
        return None
    keys = [key.lower() for key, _, _ in entries]
    gates = [
        entry
        for entry in entries
        if _gate_key(rule, entry[0], entry[1], [k for k in keys if k != entry[0].lower()])
    ]
    return gates[0] if len(gates) == 1 else None


def _gate_key(rule: Rule, key: str, value: cst.BaseExpression, others: list[str]) -> bool:
    names = rule.context.gate_caches
    lowered = key.lower()
    if names.names_gate_dtype(key):
        return False  # a setting: config_settings reports it
    if names.matches(key):
        return literal_string(value) is not None  # a torch dtype there is an allocation's
    if lowered in TABLE_GATE_WORDS:
        return True
    if lowered in TABLE_SHARED_WORDS:
        words = [set(other.split("_")) for other in others]
        return any(w & set(D_WORDS) for w in words) and any(w & set(K_WORDS) for w in words)
    return False


def _dtype_of(rule: Rule, value: cst.BaseExpression) -> str | None:
    """The floating dtype a value names: a string (``"bf16"``) or a torch dtype attribute."""
    text = literal_string(value)
    if text is not None:
        return string_dtype(text)
    if isinstance(value, cst.Attribute):
        for name in rule.provenance.index.qualified_names(value):
            dtype = dtype_from_qualified_name(name)
            if dtype is not None:
                return dtype
    return None


def _fix(rule: Rule, value: cst.BaseExpression, text: str | None) -> FixDraft | None:
    """float32 in the table's own spelling: unsafe, as for any setting (every reader of the
    entry sees float32)."""
    if text is None:
        return rule.setting_fix(value, rule.site())
    return string_fix(value, float32_spelling(text))


RING_WORD_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        RING_PRECISION = {
            "fp16": {"ring": "float16", "log_decay": "float32"},
            "bf16": {"ring": "bfloat16", "log_decay": "float32"},
        }

        # a router's gate beside its experts is no ring's
        ROUTER_DTYPES = {"gate": torch.bfloat16, "experts": torch.bfloat16}
        """
    ),
)

RING_WORD_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        RING_PRECISION = {
            "fp16": {"ring": "float16", "log_decay": "float32"},
            "memory_efficient_fp16": {"ring": "float16", "log_decay": "float16"},
        }
        """,
        expected_fix="""
        RING_PRECISION = {
            "fp16": {"ring": "float16", "log_decay": "float32"},
            "memory_efficient_fp16": {"ring": "float16", "log_decay": "float32"},
        }
        """,
        message_contains="`log_decay`, the gate ring's entry of a table of ring dtypes",
    ),
    Invalid(
        """
        import torch

        CACHE_DTYPES = {
            "float16": {"delta": torch.float16, "key": torch.float16, "gate": torch.float16},
        }
        """,
        expected_fix="""
        import torch

        CACHE_DTYPES = {
            "float16": {"delta": torch.float16, "key": torch.float16, "gate": torch.float32},
        }
        """,
        message_contains="`gate`, the gate ring's entry of a table of ring dtypes, is torch.float16",
    ),
)
