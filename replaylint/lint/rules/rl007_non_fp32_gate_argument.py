"""RL007: a ReplaySSM decode entry point called with a gate cache that is provably not float32."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import literal_names
from replaylint.lint.syntax.nodes import dotted_name, keyword_arg, one_line, positional_args


class NonFp32GateArgument(Rule):
    SUMMARY = (
        "A ReplaySSM decode entry point is called with a gate cache that is provably not float32 "
        "in the same function."
    )
    RATIONALE = """\
This is the call-site view of the other rules: the decode kernel receives the gate ring and, in the
same function, the line that made it non-float32 is visible — an allocation with a non-float32
dtype, a cast, a checkpoint load without a cast. The kernel sums the ring's log-decays and
exponentiates the sums; in bf16 the decays are off by ~1.5% at ring length 16, and the error is
folded into the checkpoint at every flush. A kernel that validates its arguments raises; one that
does not silently computes drifting outputs.

Entry points: by default any function whose name ends in `replayssm_decode`, with the gate cache
as keyword `g_cache` or the 10th positional argument (the sglang argument order); more via
`entry-points` in the configuration. The argument is followed through local bindings in the
function: only what is *provably* not float32 is reported (an unknown dtype is not), so a gate
cache received as a parameter or read from `self` is never a finding here.
"""
    FIX = """\
No fix: the line to change is the one that made the tensor non-float32, which the message names;
when that line is a gate-cache binding, RL001-RL005 report it with a fix, and this finding goes
away once it is fixed.
"""
    FIX_APPLICABILITY = None

    VALID = (
        Valid(
            """
            import torch

            def decode(self, mixed_qkv, a, b, out, slots, write_pos):
                # the pool's own gate ring: float32 where it is allocated (checked there)
                fused_recurrent_kda_replayssm_decode(
                    mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, self.state,
                    self.d_cache, self.k_cache, self.g_cache, out, slots, write_pos,
                )
            """
        ),
        Valid(
            """
            import torch

            def test_decode(shape, device):
                g_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device).float()
                d_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
                kda_replayssm_decode(d_cache=d_cache, g_cache=g_cache)
            """
        ),
        Valid(
            """
            def packed_decode(self, mixed_qkv, **kwargs):
                replayssm_g = kwargs.get("replayssm_g")
                if replayssm_g is not None:
                    fused_recurrent_linear_replayssm_decode(mixed_qkv, g_cache=replayssm_g)
            """
        ),
        Valid(
            """
            import torch

            def step(ring_dtype, shape):
                # the d ring may be bf16; the gate argument is a float32 local
                d = torch.zeros(shape, dtype=ring_dtype)
                gates = torch.zeros(shape, dtype=torch.float32)
                my_replayssm_decode(d_cache=d, g_cache=gates)
            """
        ),
    )
    INVALID = (
        Invalid(
            """
            import torch

            def run(shape, device):
                gates = torch.zeros(shape, dtype=torch.bfloat16, device=device)
                kda_replayssm_decode(mixed_qkv, a, b, A_log, dt_bias, 0.125, h0, d, k, gates, out)
            """,
            message_contains="line 4",
        ),
        Invalid(
            """
            import torch

            def resume(path, step_inputs):
                state = torch.load(path)
                ring = state["gates"]
                return ops.fused_recurrent_linear_replayssm_decode(*step_inputs, g_cache=ring)
            """,
            message_contains="loaded",
        ),
        Invalid(
            """
            def decode_half(self, inputs):
                g = self.g_cache.half()
                kda_replayssm_decode(**inputs, g_cache=g)
            """,
            message_contains="torch.float16",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        entry_point = self._entry_point(node)
        if entry_point is None:
            return
        argument = keyword_arg(node, entry_point.parameter)
        if argument is None and entry_point.index is not None:
            positional = positional_args(node)
            if not any(arg.star == "*" for arg in node.args) and entry_point.index < len(
                positional
            ):
                argument = positional[entry_point.index]
        if argument is None:
            return
        facts = [
            fact
            for fact in self.provenance.tensor_facts(argument.value, self.site())
            if _provably_not_float32(fact)
        ]
        if not facts:
            return
        causes = "; ".join(self._cause(fact) for fact in facts[:3])
        function = one_line(self.context.module, node.func)
        self.report(
            argument.value,
            f"the gate cache passed to `{function}` is not float32: {causes}; the kernel "
            "exponentiates prefix sums of the gate ring, so it must be float32",
        )

    def _entry_point(self, call: cst.Call) -> EntryPoint | None:
        written = dotted_name(call.func)
        names = {written} if written else set()
        names |= self.context.qualified_names(call.func)
        for entry_point in self.context.entry_points:
            if any(entry_point.matches(name) for name in names):
                return entry_point
        return None

    def _cause(self, fact: TensorFact) -> str:
        line = self.context.line_of(fact.node)
        if fact.kind is Kind.LOADED:
            what = f"it is loaded from {fact.detail} without a cast"
        elif fact.kind is Kind.CAST:
            what = f"{fact.detail} casts it to {literal_names(fact.non_float32_literals)}"
        else:
            allocation = fact.allocation.call if fact.allocation is not None else fact.node
            what = (
                f"`{one_line(self.context.module, allocation)}` allocates it as "
                f"{literal_names(fact.non_float32_literals)}"
            )
        return f"line {line}: {what}"


def _provably_not_float32(fact: TensorFact) -> bool:
    if fact.kind is Kind.LOADED:
        return True
    return fact.kind in {Kind.EXPLICIT, Kind.CAST} and bool(fact.non_float32_literals)
