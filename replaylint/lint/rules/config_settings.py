"""Gate-dtype settings written as strings, for RL001: a keyword, default or assignment named for
the gate cache's dtype given ``"bf16"``, and an entry of a config literal (``{"decode_cache":
{"gate_dtype": "${dtype}"}}``) whose key names the gate dtype and whose value names, or
interpolates to, a dtype narrower than float32 (:mod:`replaylint.lint.dataflow.dtype_strings`);
with RL001's examples of them."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.dtype_strings import (
    config_entries,
    float32_spelling,
    string_dtype,
)
from replaylint.lint.dataflow.dtype_tables import narrower_literals
from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.nodes import literal_string

__all__ = [
    "CONFIG_INVALID",
    "CONFIG_VALID",
    "report_config_entries",
    "report_string_setting",
    "string_fix",
]


def report_string_setting(rule: Rule, name: str, value: cst.BaseExpression) -> bool:
    """Report ``name`` (named for the gate dtype) set to a string naming a narrower dtype
    (``gate_dtype="bf16"``); whether it was reported."""
    text = literal_string(value)
    dtype = None if text is None else string_dtype(text)
    if text is None or dtype is None or dtype == "float32" or dtype == "float64":
        return False
    rule.report(
        value,
        f'`{name}`, named for the gate cache\'s dtype, is set to "{text}" ({literal_names([dtype])}); '
        f"{WHY}",
        fix=string_fix(value, float32_spelling(text)),
    )
    return True


def report_config_entries(rule: Rule, root: cst.Dict) -> None:
    """Report each entry of the config literal ``root`` (nested literals included) whose key is
    named for the gate cache's dtype and whose value is narrower than float32: a string that
    names one, directly or through interpolations, or (inside a function) dtype literals."""
    names = rule.context.gate_caches
    site = rule.site()
    in_function = len(site.scopes) > 1
    float32_texts: list[str] = []
    found = list(config_entries(root))
    for entry in found:
        text = literal_string(entry.value)
        if entry.dtype == "float32" and not entry.through and text is not None:
            float32_texts.append(text)  # the config's own spelling, for the fix
    for entry in found:
        if not names.names_gate_dtype(entry.key):
            continue
        text = literal_string(entry.value)
        if text is None:
            narrower = (
                narrower_literals(rule.provenance, entry.value, site) if in_function else None
            )
            if narrower is not None:
                rule.report(
                    entry.value,
                    f"`{entry.key}`, named for the gate cache's dtype, is set to "
                    f"{literal_names(narrower)}; {WHY}",
                    fix=rule.setting_fix(entry.value, site),
                )
            continue
        if entry.dtype is None or entry.dtype in {"float32", "float64"}:
            continue
        through = "".join(f'through "{step}", ' for step in entry.through[1:])
        spelled = float32_texts[0] if entry.through and float32_texts else float32_spelling(text)
        rule.report(
            entry.value,
            f'`{entry.key}`, named for the gate cache\'s dtype, is set to "{text}" '
            f"({through}{literal_names([entry.dtype])}); {WHY}",
            fix=string_fix(entry.value, spelled),
        )


def string_fix(value: cst.BaseExpression, spelled: str) -> FixDraft | None:
    """The string rewritten to name float32, in its own quotes: unsafe, as for any setting
    (whatever else reads it sees float32 too)."""
    if not isinstance(value, cst.SimpleString):
        return None
    prefix = value.prefix
    quote = value.quote
    edit = Replace(value, f"{prefix}{quote}{spelled}{quote}")
    return FixDraft(f'Make it "{spelled}"', (edit,), Applicability.UNSAFE)


CONFIG_VALID: tuple[Valid, ...] = (
    Valid(
        """
        MODEL_DEFAULTS = {
            "dtype": "bf16",
            "decode_cache": {
                "ring_dtype": "${dtype}",  # the d and k rings follow the model
                "gate_dtype": "fp32",
                "state_dtype": "${.gate_dtype}",
            },
        }

        def build(cache_cls, slots):
            return cache_cls(slots, ring_dtype="bf16", gate_dtype="float32", attn_impl="sdpa")
        """
    ),
)
CONFIG_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        MODEL_DEFAULTS = {
            "dtype": "bf16",
            "decode_cache": {
                "ring_dtype": "${dtype}",
                "gate_dtype": "${decode_cache.ring_dtype}",
                "state_dtype": "fp32",
            },
        }
        """,
        expected_fix="""
        MODEL_DEFAULTS = {
            "dtype": "bf16",
            "decode_cache": {
                "ring_dtype": "${dtype}",
                "gate_dtype": "fp32",
                "state_dtype": "fp32",
            },
        }
        """,
        message_contains='"${decode_cache.ring_dtype}" (through "${dtype}", torch.bfloat16)',
    ),
    Invalid(
        """
        def serving_cache(cache_cls, slots):
            return cache_cls(slots, ring_dtype="half", gate_dtype="half")
        """,
        expected_fix="""
        def serving_cache(cache_cls, slots):
            return cache_cls(slots, ring_dtype="half", gate_dtype="float32")
        """,
        message_contains='`gate_dtype`, named for the gate cache\'s dtype, is set to "half"',
    ),
    Invalid(
        """
        import torch

        def cache_kwargs(model_dtype):
            return {"ring_dtype": model_dtype, "gate_dtype": torch.bfloat16}
        """,
        expected_fix="""
        import torch

        def cache_kwargs(model_dtype):
            return {"ring_dtype": model_dtype, "gate_dtype": torch.float32}
        """,
        message_contains="`gate_dtype`, named for the gate cache's dtype, is set to torch.bfloat16",
    ),
)
