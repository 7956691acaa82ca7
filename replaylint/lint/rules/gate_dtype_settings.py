"""Settings named for the gate cache's dtype, for RL001: a keyword, default, assignment or a
function's ``return`` (``gate_dtype=...``, ``def log_decay_dtype(mode): return ...``) that sets
it to a dtype narrower than float32; each branch of a conditional on its own. A value that is
another such setting (``gate_dtype=gate_dtype``, ``log_decay_dtype(mode)``) is judged where
that one is set. With RL001's examples of them."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.dtype_tables import (
    chosen_by_gate_setting,
    gate_dtype_name,
    narrower_in,
)
from replaylint.lint.dataflow.imported import element_dtype_facts
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.torch_api import FLOATING_RANK
from replaylint.lint.dataflow.unpacked import element_dtypes, unpacked_elements
from replaylint.lint.gatecache.names import GATE_FIELD_WORDS
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.config_settings import report_string_setting
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.sites import Site

__all__ = [
    "SETTING_INVALID",
    "SETTING_VALID",
    "report_returned_setting",
    "report_setting",
    "report_unpacked_settings",
]


def report_setting(
    rule: Rule, target: cst.CSTNode | None, value: cst.BaseExpression | None
) -> None:
    """``target = value`` (an assignment, a keyword, a default), when ``target`` is named for
    the gate cache's dtype."""
    site = rule.site()
    name = gate_dtype_name(rule.provenance, target, site) if value is not None else None
    if name is not None and value is not None:
        _setting(rule, name, value, site, "is set to")


def report_unpacked_settings(rule: Rule, node: cst.Assign) -> None:
    """``ring_dtype, gate_dtype = RING_DTYPES[mode]``: each unpacked name named for the gate
    cache's dtype is set to its element, judged where that element is written (a literal of
    the tuple, an entry of a table of the module; of each entry when the key is not known), or
    at the value for a table or function of another module of the project."""
    site = rule.site()
    prov = rule.provenance
    for target in node.targets:
        names = target.target
        if not isinstance(names, (cst.Tuple, cst.List)):
            continue
        for position, element in enumerate(names.elements):
            name = gate_dtype_name(prov, element.value, site) or _gate_of_dtypes(
                rule, names, position, node.value
            )
            if name is None or isinstance(element, cst.StarredElement):
                continue
            found = unpacked_elements(prov, node.value, position, site, NO_ENV)
            if found is None:
                found = [(node.value, site, position)]  # of another module: read whole
            for value, where, pending in found:
                if pending is None:
                    _setting(rule, name, value, where, "is set to")
                else:
                    _imported_element(rule, name, value, pending, where)


def _imported_element(
    rule: Rule, name: str, value: cst.BaseExpression, position: int, site: Site
) -> None:
    """The element ``position`` of ``value``, a table entry or call of another module of the
    project, reported at ``value`` when it is narrower than float32."""
    facts = element_dtype_facts(rule.provenance, value, position, site, NO_ENV) or ()
    narrower = narrower_in(facts)
    if narrower:
        origins = sorted({f.origin for f in facts if not f.is_float32 and f.origin})
        whence = f" ({'; '.join(origins)})" if origins else ""
        verb = "may be set to" if any(f.is_float32 for f in facts) else "is set to"
        rule.report(
            value,
            f"`{name}`, named for the gate cache's dtype, {verb} "
            f"{literal_names(narrower)}{whence}; {WHY}",
        )


def _gate_of_dtypes(
    rule: Rule, names: cst.Tuple | cst.List, position: int, value: cst.BaseExpression
) -> str | None:
    """``ring, gate, state = STATE_DTYPES[precision]``: a name that is the gate ring's word
    (``gate``, ``g``, ``log_decay``) among names unpacked from a tuple of dtypes only (every
    element a floating dtype literal): the gate ring's dtype."""
    element = names.elements[position].value
    word = element.value if isinstance(element, cst.Name) else None
    if word is None or word.lower() not in GATE_FIELD_WORDS or len(names.elements) < 2:
        return None
    prov, site = rule.provenance, rule.site()
    for other in range(len(names.elements)):
        found = unpacked_elements(prov, value, other, site, NO_ENV) or [(value, site, other)]
        facts = element_dtypes(prov, found, NO_ENV)
        if not facts or any(f.dtype not in FLOATING_RANK for f in facts):
            return None
    return word


def report_returned_setting(rule: Rule, node: cst.Return) -> None:
    """A ``return`` of a function named for the gate cache's dtype: what it returns is judged
    like an assigned value."""
    scope = rule.site().scope
    if node.value is not None and isinstance(scope, cst.FunctionDef):
        name = scope.name.value
        if rule.context.gate_caches.names_gate_dtype(name):
            _setting(rule, name, node.value, rule.site(), "returns")


def _setting(rule: Rule, name: str, value: cst.BaseExpression, site: Site, verb: str) -> None:
    if isinstance(value, cst.SimpleString):
        report_string_setting(rule, name, value)  # `gate_dtype="bf16"`
        return
    if isinstance(value, cst.IfExp):
        _setting(rule, name, value.body, site, verb)
        _setting(rule, name, value.orelse, site, verb)
        return
    if isinstance(value, cst.Name) and gate_dtype_name(rule.provenance, value, site):
        return  # `gate_dtype=gate_dtype`: judged where that name is set
    if _calls_a_setting(rule, value):
        return  # `gate_dtype=log_decay_dtype(mode)`: judged at that function's returns
    facts = rule.provenance.dtype_facts(value, site)
    narrower = narrower_in(facts)
    if narrower is None or chosen_by_gate_setting(rule.provenance, facts):
        return  # `gate_dtype=str2dtype(opt.gate_dtype)`: judged where that setting is set
    if verb == "is set to" and any(f.is_float32 for f in facts):
        verb = "may be set to"
    origins = sorted({f.origin for f in facts if not f.is_float32 and f.origin})
    whence = (
        f" ({'; '.join(origins)})"
        if isinstance(value, (cst.Call, cst.Subscript)) and origins
        else ""
    )
    rule.report(
        value,
        f"`{name}`, named for the gate cache's dtype, {verb} {literal_names(narrower)}"
        f"{whence}; {WHY}",
        fix=rule.setting_fix(value, site),
    )


def _calls_a_setting(rule: Rule, value: cst.BaseExpression) -> bool:
    """Whether ``value`` calls a function named for the gate cache's dtype."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    return isinstance(name, str) and rule.context.gate_caches.names_gate_dtype(name)


SETTING_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        def log_decay_dtype(mode):
            # every quantization mode keeps the log-decays in float32
            return torch.float32

        def build(cache_cls, mode, given=None):
            gate_dtype = given if given is not None else log_decay_dtype(mode)
            return cache_cls(gate_dtype=gate_dtype)
        """
    ),
    Valid(
        """
        import torch

        # (d/k rings, log-decay ring) per activation dtype
        RING_DTYPES = {
            "float16": (torch.float16, torch.float32),
            "bfloat16": (torch.bfloat16, torch.float32),
        }

        def build(cache_cls, mode):
            ring_dtype, gate_dtype = RING_DTYPES[mode]
            return cache_cls(ring_dtype=ring_dtype, gate_dtype=gate_dtype)
        """
    ),
)
SETTING_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        def log_decay_dtype(mode):
            if mode in ("int4", "int4-gptq"):
                return torch.bfloat16  # the int4 path runs bf16 end to end
            return torch.float32
        """,
        expected_fix="""
        import torch

        def log_decay_dtype(mode):
            if mode in ("int4", "int4-gptq"):
                return torch.float32  # the int4 path runs bf16 end to end
            return torch.float32
        """,
        message_contains="`log_decay_dtype`, named for the gate cache's dtype, returns torch.bfloat16",
    ),
    Invalid(
        """
        import torch

        def build(cache_cls, given=None):
            gate_dtype = given.gate if given is not None else torch.float16
            return cache_cls(gate_dtype=gate_dtype)
        """,
        expected_fix="""
        import torch

        def build(cache_cls, given=None):
            gate_dtype = given.gate if given is not None else torch.float32
            return cache_cls(gate_dtype=gate_dtype)
        """,
        message_contains="`gate_dtype`, named for the gate cache's dtype, is set to torch.float16",
    ),
    Invalid(
        """
        import torch

        # (d/k rings, log-decay ring) per activation dtype
        RING_DTYPES = {
            "float16": (torch.float16, torch.float32),
            "bfloat16": (torch.bfloat16, torch.bfloat16),
        }

        def build(cache_cls, mode):
            # any entry of the table may be unpacked here
            ring_dtype, gate_dtype = RING_DTYPES[mode]
            return cache_cls(ring_dtype=ring_dtype, gate_dtype=gate_dtype)
        """,
        expected_fix="""
        import torch

        # (d/k rings, log-decay ring) per activation dtype
        RING_DTYPES = {
            "float16": (torch.float16, torch.float32),
            "bfloat16": (torch.bfloat16, torch.float32),
        }

        def build(cache_cls, mode):
            # any entry of the table may be unpacked here
            ring_dtype, gate_dtype = RING_DTYPES[mode]
            return cache_cls(ring_dtype=ring_dtype, gate_dtype=gate_dtype)
        """,
        message_contains="`gate_dtype`, named for the gate cache's dtype, is set to torch.bfloat16",
    ),
)
