"""RL003's gate functions whose paths disagree: one return computes the log-decays in float32,
another in the activations' dtype.

``def log_decay(self, x)`` returns ``-self.A_log.float().exp() * F.softplus(logits.float())``
on one path and ``self.lower_bound * logits.sigmoid()`` on the other: the first path shows that
its callers want float32 log-decays, the second hands them the model's dtype (bf16 in a bf16
model), and the ring receives them rounded. A function counts when its name says it makes the
gate (``gate``, ``decay``, ``forget`` in it, ``log_decay``, ``_gate``, ``compute_forget``), and
a return counts as float32 when every way its value is made is float32, as the activations'
dtype when every way is computed from activations (:mod:`replaylint.lint.dataflow.activations`).
The finding has no fix: where the float32 cast belongs (the logits, the bound, the product)
depends on the computation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import WHY
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.sites import Site

__all__ = ["SPLIT_INVALID", "SPLIT_VALID", "SplitReturn", "split_return"]

_GATE_FUNCTION = re.compile(r"gate|decay|forget", re.IGNORECASE)


@dataclass(frozen=True)
class SplitReturn:
    """A finding to make once the module is read, unless another one covers its node."""

    node: cst.BaseExpression
    message: str


def split_return(rule: Rule, returned: cst.Return) -> SplitReturn | None:
    """The finding for ``returned`` when it hands out activation-dtype log-decays from a gate
    function whose other return is float32. It is made at the end of the module, when no
    finding of the gate cache the value becomes (with its fix) is at the same place."""
    site = rule.site()
    function = site.scope
    if (
        returned.value is None
        or not isinstance(function, cst.FunctionDef)
        or not _GATE_FUNCTION.search(function.name.value)
        or function.name.value.startswith("__")
    ):
        return None
    facts = rule.provenance.tensor_facts(returned.value, site)
    if not facts or not all(fact.kind is Kind.ACTIVATION for fact in facts):
        return None
    float32_line = None
    for other, line in rule.context.scope(function).returns:  # its own, not nested functions
        if other is returned or other.value is None:
            continue
        others = rule.provenance.tensor_facts(other.value, Site(site.scopes, line))
        if others and all(fact.kind is Kind.FLOAT32 for fact in others):
            float32_line = rule.context.line_of(other)
            break
    if float32_line is None:
        return None
    name = function.name.value
    value = one_line(rule.context.module, returned.value)
    return SplitReturn(
        returned.value,
        f"`{name}` returns log-decays computed in the activations' dtype here (`{value}`, "
        f"{facts[0].detail}) and in float32 on line {float32_line}; compute this path in "
        f"float32 too, or the gate ring receives them rounded ({WHY})",
    )


SPLIT_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class GateProjection(nn.Module):
            def __init__(self, dim, lower_bound=None):
                super().__init__()
                self.proj = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(dim))
                self.lower_bound = lower_bound
                self.register_buffer("g_cache", torch.zeros(4, dim, dtype=torch.float32))

            def log_decay(self, x):
                logits = self.proj(x)
                # both paths in float32
                if self.lower_bound is not None:
                    return self.lower_bound * logits.float().sigmoid()
                return -self.A_log.float().exp() * F.softplus(logits.float())
        """
    ),
)

SPLIT_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class GateProjection(nn.Module):
            def __init__(self, dim, lower_bound=None):
                super().__init__()
                self.proj = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(dim))
                self.lower_bound = lower_bound
                self.register_buffer("g_cache", torch.zeros(4, dim, dtype=torch.float32))

            def log_decay(self, x):
                logits = self.proj(x)
                if self.lower_bound is not None:
                    # the bounded form: computed in the model's dtype
                    return self.lower_bound * logits.sigmoid()
                return -self.A_log.float().exp() * F.softplus(logits.float())
        """,
        message_contains="returns log-decays computed in the activations' dtype here",
    ),
    Invalid(
        """
        import torch
        import torch.nn.functional as F
        from einops import rearrange
        from torch import nn

        class GateProjection(nn.Module):
            def __init__(self, dim, heads, lower_bound=None):
                super().__init__()
                self.heads = heads
                self.to_gate = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(heads, 1))
                self.lower_bound = lower_bound
                self.register_buffer("g_cache", torch.zeros(4, heads, dim, dtype=torch.float32))

            def log_decay(self, x):
                # a rearrangement keeps the layer output's dtype
                logits = rearrange(self.to_gate(x), "b n (h d) -> b n h d", h=self.heads)
                if self.lower_bound is not None:
                    return self.lower_bound * logits.sigmoid()
                return -self.A_log.float().exp() * F.softplus(logits.float())
        """,
        message_contains="`self.to_gate(x)`, a layer's output",
    ),
)
