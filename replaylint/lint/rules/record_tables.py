"""Dtype policies written as records and zipped tables, for RL001 and RL002: a record of the
rings' dtypes whose gate field a construction gives a literal narrower than float32
(:mod:`replaylint.lint.dataflow.dtype_records`), and the gate entry of ``dict(zip(NAMES,
dtypes))`` (:func:`~replaylint.lint.dataflow.dtype_tables.zipped_table_entries`); with RL001's
examples of settings, records and tables of the gate cache's dtype."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.dtype_records import (
    GateField,
    gate_field_arguments,
    record_dtype_fields,
    spread_elements,
)
from replaylint.lint.dataflow.dtype_tables import narrower_literals, zipped_table_entries
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.nodes import one_line, self_attribute

__all__ = [
    "RECORD_INVALID",
    "RECORD_VALID",
    "report_gate_following_ring",
    "report_gate_sharing_ring",
    "report_narrow_gate_fields",
    "report_zipped_entries",
]


def report_narrow_gate_fields(rule: Rule, call: cst.Call) -> None:
    """Report each gate-dtype field of the record ``call`` builds that it gives a narrower
    literal (a keyword named for the gate dtype is reported as a setting already)."""
    site = rule.site()
    for gate in gate_field_arguments(rule.provenance, call):
        if gate.passed == "keyword" and rule.context.gate_caches.names_gate_dtype(gate.field):
            continue
        narrower = narrower_literals(rule.provenance, gate.value, site)
        if narrower is None:
            continue
        record = rule.context.module.code_for_node(call.func).strip()
        facts = rule.provenance.dtype_facts(gate.value, site)
        verb = "may be given" if any(f.is_float32 for f in facts) else "is given"
        rule.report(
            gate.arg if gate.passed == "spread" else gate.value,
            f"`{gate.field}` of `{record}`, the gate ring's dtype, {verb} "
            f"{literal_names(narrower)}; {WHY}",
            fix=_fix(rule, gate),
        )


def report_gate_following_ring(
    rule: Rule, target: cst.BaseExpression, value: cst.BaseExpression
) -> None:
    """``self.gate = self.ring`` in a method of a record of ring dtypes (``__post_init__``
    filling a gate field left None): the gate ring takes another ring's dtype (RL002)."""
    site = rule.site()
    owner = site.enclosing_class()
    if owner is None or not (self_attribute(target) and self_attribute(value)):
        return
    assert isinstance(target, cst.Attribute)
    assert isinstance(value, cst.Attribute)
    fields = record_dtype_fields(rule.provenance, owner)
    if fields is None or target.attr.value != fields[0]:
        return
    other = value.attr.value
    if other == fields[0] or other not in fields[1]:
        return
    facts = rule.provenance.dtype_facts(value, site)
    if facts and all(f.is_float32 for f in facts):
        return
    rule.report(
        value,
        f"`{fields[0]}` of `{owner.name.value}`, the gate ring's dtype, is set to `{other}`, the "
        f"dtype of another ring, which is not provably float32; {WHY}",
        fix=rule.setting_fix(value, site),
    )


def report_gate_sharing_ring(rule: Rule, call: cst.Call, gate: GateField) -> bool:
    """``RingDtypes(delta=storage, key=storage, gate=storage)``: the record's gate field given
    the very value another of its rings' fields is given, which is not provably float32 (RL002);
    whether it was reported."""
    value = gate.value
    if gate.passed == "spread" or not isinstance(value, (cst.Name, cst.Attribute)):
        return False
    module = rule.context.module
    written = module.code_for_node(value)
    shared = [
        arg
        for arg in call.args
        if arg is not gate.arg and not arg.star and module.code_for_node(arg.value) == written
    ]
    if not shared:
        return False
    site = rule.site()
    facts = rule.provenance.dtype_facts(value, site)
    if (
        not facts
        or all(f.is_float32 for f in facts)
        or narrower_literals(rule.provenance, value, site)
    ):
        return False  # float32, or a narrower literal: RL001's
    other = shared[0].keyword.value if shared[0].keyword is not None else "another field"
    record = module.code_for_node(call.func).strip()
    rule.report(
        value,
        f"`{gate.field}` of `{record}`, the gate ring's dtype, is given `{written}`, the value "
        f"given to `{other}` for another ring, which is not provably float32; {WHY}",
        fix=rule.setting_fix(value, site),
    )
    return True


def report_zipped_entries(rule: Rule, call: cst.Call, kind: Kind) -> None:
    """Report the gate entries of the zipped dtype table ``call`` builds whose fact is ``kind``
    (RL001: a narrower literal; RL002: a dtype that is not provably float32)."""
    site = rule.site()
    entries = zipped_table_entries(rule.provenance, call, site)
    table = one_line(rule.context.module, call) if entries else ""
    for entry in entries:
        for fact in entry.facts:
            if fact.kind is not kind:
                continue
            given, which = (
                (literal_names(fact.non_float32_literals), "")
                if kind is Kind.EXPLICIT
                else (f"`{one_line(rule.context.module, entry.value)}`", ", not provably float32")
            )
            rule.report(
                entry.value,
                f"gate cache `{entry.name}` is given {given} by the dtype table `{table}`{which}; "
                f"{WHY}",
                fix=_element_fix(rule, entry.value, entry.spread, entry.place),
            )


def _fix(rule: Rule, gate: GateField) -> FixDraft | None:
    """Float32 for the field alone: unsafe, as for a setting (whatever else reads the record's
    field sees float32 too)."""
    spread = gate.arg.value if gate.passed == "spread" else None
    return _element_fix(rule, gate.value, spread, gate.spread_place)


def _element_fix(
    rule: Rule, value: cst.BaseExpression, spread: cst.BaseExpression | None, place: int
) -> FixDraft | None:
    """Float32 for ``value``; a repeated spread it is an element of (``*(torch.bfloat16,) *
    4``) is written out first, since its one element stands for all of them."""
    site = rule.site()
    if spread is None or isinstance(spread, (cst.Tuple, cst.List)):
        return rule.setting_fix(value, site)
    module = rule.context.module
    elements = [module.code_for_node(e).strip() for e in spread_elements(spread) or ()]
    elements[place] = rule.float32(site)
    edit = Replace(spread, f"({', '.join(elements)})")
    return FixDraft(f"Make it {rule.float32(site)}", (edit,), Applicability.UNSAFE)


RECORD_VALID: tuple[Valid, ...] = (
    Valid(
        """
        from typing import NamedTuple

        import torch

        class CacheRecipe(NamedTuple):
            state: torch.dtype
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype

        RECIPES = {
            "bf16": CacheRecipe(torch.float32, torch.bfloat16, torch.bfloat16, torch.float32),
            "fp32": CacheRecipe(*(torch.float32,) * 4),
        }

        class MoeDtypes(NamedTuple):
            experts: torch.dtype
            gate: torch.dtype  # a router's gate: no ring beside it

        MOE = MoeDtypes(torch.bfloat16, torch.bfloat16)
        """
    ),
)
RECORD_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class KDALayerState(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def layer_state(shape, dtype):
            # built in field order: the third argument is the gate ring
            return KDALayerState(
                torch.zeros(shape, dtype=dtype),
                torch.zeros(shape, dtype=dtype),
                torch.zeros(shape, dtype=torch.bfloat16),
            )
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class KDALayerState(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def layer_state(shape, dtype):
            # built in field order: the third argument is the gate ring
            return KDALayerState(
                torch.zeros(shape, dtype=dtype),
                torch.zeros(shape, dtype=dtype),
                torch.zeros(shape, dtype=torch.float32),
            )
        """,
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class LayerState(NamedTuple):
            ssm_state: torch.Tensor
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        # a table from the record's field names: the last entry is the gate ring's
        WIRE_DTYPES = dict(zip(LayerState._fields, (torch.float32, torch.half, torch.half, torch.half)))
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class LayerState(NamedTuple):
            ssm_state: torch.Tensor
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        # a table from the record's field names: the last entry is the gate ring's
        WIRE_DTYPES = dict(zip(LayerState._fields, (torch.float32, torch.half, torch.half, torch.float32)))
        """,
        message_contains="gate cache `g_cache` is given torch.float16 by the dtype table",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class KDADecodeConfig(NamedTuple):
            ring_len: int = 4
            gate_dtype: torch.dtype = torch.bfloat16
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class KDADecodeConfig(NamedTuple):
            ring_len: int = 4
            gate_dtype: torch.dtype = torch.float32
        """,
        message_contains="named for the gate cache's dtype",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class CacheRecipe(NamedTuple):
            state: torch.dtype
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype

        # every ring of the recipe in bf16, the gate ring's log-decays too
        BF16 = CacheRecipe(*(torch.bfloat16,) * 4)
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class CacheRecipe(NamedTuple):
            state: torch.dtype
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype

        # every ring of the recipe in bf16, the gate ring's log-decays too
        BF16 = CacheRecipe(*(torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32))
        """,
        message_contains="`gate` of `CacheRecipe`, the gate ring's dtype, is given torch.bfloat16",
    ),
    Invalid(
        """
        from dataclasses import dataclass

        import torch

        @dataclass(frozen=True)
        class RingDtypes:
            d_cache: torch.dtype
            k_cache: torch.dtype
            g_cache: torch.dtype

        def half_rings():
            return RingDtypes(torch.half, torch.half, g_cache=torch.half)
        """,
        expected_fix="""
        from dataclasses import dataclass

        import torch

        @dataclass(frozen=True)
        class RingDtypes:
            d_cache: torch.dtype
            k_cache: torch.dtype
            g_cache: torch.dtype

        def half_rings():
            return RingDtypes(torch.half, torch.half, g_cache=torch.float32)
        """,
        message_contains="`g_cache` of `RingDtypes`",
    ),
)
