"""RL007: a ReplaySSM decode entry point called with a gate cache that is provably not float32."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from replaylint.lint.dataflow.arguments import (
    PassedValue,
    parameter_position,
    passed_values,
    ring_arguments,
)
from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import ARGUMENT_FIX_SAFETY, literal_names
from replaylint.lint.syntax.nodes import binding_name, dotted_name, keyword_arg, one_line
from replaylint.lint.syntax.sites import Site


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
as keyword `g_cache` or the 10th positional argument (the sglang argument order; the position in
the signature when the module defines the entry point itself); more via `entry-points` in the
configuration. The argument is found however the call passes it: by keyword or position, in a
`**ring_args` mapping (`dict(g_cache=g)`, a dict literal, `ring_args["g_cache"] = x` or
`ring_args.update(g_cache=x)` before the call), or in a `*rings` tuple, NamedTuple or list whose
elements the function shows. Its value is followed through local bindings, fields of NamedTuples
and dataclasses built in the module (`rings.g`, `rings._replace(g=x)`, `rings[2]`), tuple
unpacking (`d, k, g = load_rings(path)`, where `load_rings` is a function of the module) and
helpers of the module; a `*inputs` spread whose length the module fixes (a tuple or list, a
comprehension over one) keeps the places after it. Only what is *provably* not float32 is reported
(an unknown dtype is not), so a gate cache received as a parameter, read from `self`, or passed in
a mapping the function does not build is never a finding here. One cast is wrong by design: to
the dtype of the d or k ring the same call passes (`g.to(d_cache.dtype)`, `g.type_as(d_cache)`),
since those rings follow the model's dtype; it is reported unless that ring is provably float32,
and its fix (a cast to float32) is unsafe: the kernel then writes into the ring, not into a copy.
"""
    FIX = (
        """\
The fix changes the one line that made the value non-float32 — the allocation's dtype, the cast,
a cast of the load — that the message names.
"""
        + ARGUMENT_FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE

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
        Valid(
            """
            import torch

            def decode_step(mixed_qkv, shape, ring_dtype):
                ring_args = dict(
                    d_cache=torch.zeros(shape, dtype=ring_dtype),
                    g_cache=torch.zeros(shape, dtype=torch.float32),
                )
                return replayssm_decode(mixed_qkv, **ring_args)
            """
        ),
        Valid(
            """
            import torch

            def decode_step(mixed_qkv, shape, pool_rings):
                # the gate ring comes from the pool's mapping, checked where the pool makes it
                ring_args = dict(pool_rings, d_cache=torch.zeros(shape, dtype=torch.bfloat16))
                return replayssm_decode(mixed_qkv, **ring_args)
            """
        ),
        Valid(
            """
            from typing import NamedTuple

            import torch

            class Rings(NamedTuple):
                d: torch.Tensor
                k: torch.Tensor
                g: torch.Tensor

            def step(inputs, shape):
                rings = Rings(
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.float32),
                )
                # position 10 of the sglang order is the g ring: the d and k rings are bf16
                return fused_recurrent_kda_replayssm_decode(*inputs[:7], *rings, inputs[7])
            """
        ),
        Valid(
            """
            import torch

            def reference_step(q, a, b, A_log, dt_bias, state, shape, out, rows, pos):
                # an all-float32 reference: the d ring is float32, and so is the cast
                d = torch.zeros(shape, dtype=torch.float32)
                k = torch.zeros(shape, dtype=torch.float32)
                g = torch.zeros(shape, dtype=torch.float64)
                kda_replayssm_decode(
                    q, a, b, A_log, dt_bias, 0.5, state, d, k, g.to(d.dtype), out, rows, pos
                )
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
            expected_fix="""
            import torch

            def run(shape, device):
                gates = torch.zeros(shape, dtype=torch.float32, device=device)
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
            expected_fix="""
            import torch

            def resume(path, step_inputs):
                state = torch.load(path)
                ring = state["gates"].to(torch.float32)
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
            expected_fix="""
            def decode_half(self, inputs):
                g = self.g_cache.float().clone()
                kda_replayssm_decode(**inputs, g_cache=g)
            """,
            message_contains="torch.float16",
        ),
        Invalid(
            """
            import torch

            def decode_step(mixed_qkv, a, b, shape):
                d = torch.zeros(shape, dtype=torch.bfloat16)
                g16 = torch.zeros(shape, dtype=torch.bfloat16)
                ring_args = dict(d_cache=d, k_cache=d, g_cache=g16)
                return fused_recurrent_kda_replayssm_decode(mixed_qkv, a, b, **ring_args)
            """,
            expected_fix="""
            import torch

            def decode_step(mixed_qkv, a, b, shape):
                d = torch.zeros(shape, dtype=torch.bfloat16)
                g16 = torch.zeros(shape, dtype=torch.float32)
                ring_args = dict(d_cache=d, k_cache=d, g_cache=g16)
                return fused_recurrent_kda_replayssm_decode(mixed_qkv, a, b, **ring_args)
            """,
            message_contains="`**ring_args` passes",
        ),
        Invalid(
            """
            def decode_step(mixed_qkv, rings, x):
                ring_args = {"d_cache": rings.d, "k_cache": rings.k}
                ring_args["g_cache"] = x.half()
                return replayssm_decode(mixed_qkv, **ring_args)
            """,
            expected_fix="""
            def decode_step(mixed_qkv, rings, x):
                ring_args = {"d_cache": rings.d, "k_cache": rings.k}
                ring_args["g_cache"] = x.float().clone()
                return replayssm_decode(mixed_qkv, **ring_args)
            """,
            message_contains="line 3",
        ),
        Invalid(
            """
            from typing import NamedTuple

            import torch

            class Rings(NamedTuple):
                d: torch.Tensor
                k: torch.Tensor
                g: torch.Tensor

            def step(inputs, d, k, g, out):
                rings = Rings(d, k, g.to(torch.bfloat16))
                return replayssm_decode(*inputs, rings.d, rings.k, g_cache=rings.g, out=out)
            """,
            expected_fix="""
            from typing import NamedTuple

            import torch

            class Rings(NamedTuple):
                d: torch.Tensor
                k: torch.Tensor
                g: torch.Tensor

            def step(inputs, d, k, g, out):
                rings = Rings(d, k, g.to(torch.float32, copy=True))
                return replayssm_decode(*inputs, rings.d, rings.k, g_cache=rings.g, out=out)
            """,
            message_contains="line 11",
        ),
        Invalid(
            """
            import torch

            def replayssm_decode(mixed_qkv, d_cache, k_cache, g_cache):
                ...

            def step(mixed_qkv, shape):
                rings = (
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.bfloat16),
                )
                return replayssm_decode(mixed_qkv, *rings)
            """,
            expected_fix="""
            import torch

            def replayssm_decode(mixed_qkv, d_cache, k_cache, g_cache):
                ...

            def step(mixed_qkv, shape):
                rings = (
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.bfloat16),
                    torch.zeros(shape, dtype=torch.float32),
                )
                return replayssm_decode(mixed_qkv, *rings)
            """,
            message_contains="`*rings` passes",
        ),
        Invalid(
            """
            import torch

            def load_rings(path):
                blob = torch.load(path, map_location="cpu")
                return blob["d"], blob["k"], blob["g"]

            def resume(path, inputs):
                d, k, g = load_rings(path)
                return replayssm_decode(*inputs, d_cache=d, k_cache=k, g_cache=g)
            """,
            message_contains="line 5",
        ),
        Invalid(
            """
            import torch

            def bench_step(inputs, shape):
                g = torch.zeros(shape, dtype=torch.bfloat16)
                out = replayssm_decode(*inputs, d_cache=g, k_cache=g, g_cache=g)
                return out, g
            """,
            message_contains="also read elsewhere",
        ),
        Invalid(
            """
            import torch

            def decode_static(self, x, out, rows, pos):
                # one dtype for every ring input: the gate ring takes the d ring's (bf16) dtype
                kda_replayssm_decode(
                    self.wqkv(x), self.wa(x), self.wb(x), self.A_log, self.dt_bias, self.scale,
                    self.state, self.d_buf, self.k_buf, self.decay_buf.to(self.d_buf.dtype),
                    out, rows, pos,
                )
            """,
            expected_fix="""
            import torch

            def decode_static(self, x, out, rows, pos):
                # one dtype for every ring input: the gate ring takes the d ring's (bf16) dtype
                kda_replayssm_decode(
                    self.wqkv(x), self.wa(x), self.wb(x), self.A_log, self.dt_bias, self.scale,
                    self.state, self.d_buf, self.k_buf, self.decay_buf.to(torch.float32),
                    out, rows, pos,
                )
            """,
            message_contains="the dtype of `self.d_buf`, a ring this call passes",
        ),
        Invalid(
            """
            import torch
            from typing import NamedTuple

            class WarmupBuffers(NamedTuple):
                state: torch.Tensor
                d: torch.Tensor
                k: torch.Tensor
                decay: torch.Tensor

            def warmup(model, x, n, hv, dim):
                dt = model.config.torch_dtype
                bufs = WarmupBuffers(
                    torch.zeros((n, hv, dim, dim), dtype=torch.float32),
                    torch.zeros((n, hv, 8, dim), dtype=dt),
                    torch.zeros((n, hv, 8, dim), dtype=dt),
                    torch.zeros((n, hv, 8, dim), dtype=dt),
                )
                for m in model.kda_modules():
                    kda_replayssm_decode(
                        x, x, x, m.A_log, m.dt_bias, m.scale, bufs.state, *bufs[1:4], x, None, None
                    )
            """,
            expected_fix="""
            import torch
            from typing import NamedTuple

            class WarmupBuffers(NamedTuple):
                state: torch.Tensor
                d: torch.Tensor
                k: torch.Tensor
                decay: torch.Tensor

            def warmup(model, x, n, hv, dim):
                dt = model.config.torch_dtype
                bufs = WarmupBuffers(
                    torch.zeros((n, hv, dim, dim), dtype=torch.float32),
                    torch.zeros((n, hv, 8, dim), dtype=dt),
                    torch.zeros((n, hv, 8, dim), dtype=dt),
                    torch.zeros((n, hv, 8, dim), dtype=torch.float32),
                )
                for m in model.kda_modules():
                    kda_replayssm_decode(
                        x, x, x, m.A_log, m.dt_bias, m.scale, bufs.state, *bufs[1:4], x, None, None
                    )
            """,
            message_contains="the gate cache `*bufs[1:4]` passes to `kda_replayssm_decode`",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        entry_point = self._entry_point(node)
        if entry_point is None:
            return
        site = self.site()
        position = entry_point.index
        defined = called_function(self.context.index, self.provenance, node, site)
        signature = None
        if defined is not None:  # the module defines the entry point: its signature decides
            function, _, bound = defined
            position = parameter_position(function, entry_point.parameter, bound)
            signature = (function, bound)
        passed_rings: list[PassedValue] | None = None
        for passed in passed_values(self.provenance, node, entry_point.parameter, position, site):
            if passed_rings is None:
                passed_rings = ring_arguments(self.provenance, node, position, site, signature)
            self._check_passed(node, passed, passed_rings)

    def _check_passed(
        self, call: cst.Call, passed: PassedValue, passed_rings: list[PassedValue]
    ) -> None:
        facts = self.provenance.tensor_facts(passed.value, passed.site)
        wrong = [fact for fact in facts if _provably_not_float32(fact)]
        for fact in facts:
            if not wrong and self._unnamed_variable(fact, passed):
                self._report_variable(call, passed, fact)
        to_rings: dict[int, PassedValue] = {}
        for fact in facts:
            ring = self._cast_to_a_ring(fact, passed_rings) if fact not in wrong else None
            if ring is not None:
                wrong.append(fact)
                to_rings[id(fact)] = ring
        if not wrong:
            return
        causes = "; ".join(self._cause(fact, to_rings.get(id(fact))) for fact in wrong[:3])
        function = one_line(self.context.module, call.func)
        carrier = passed.argument
        located: cst.CSTNode = passed.value if carrier.value is passed.value else carrier.value
        spread = self._spread(passed)
        subject = (
            "the gate cache passed" if spread is None else f"the gate cache that {spread} passes"
        )
        fix = self._fix(facts, wrong, passed.site)
        if fix is not None and to_rings:
            # without the cast the kernel writes into the ring itself, not into a copy
            fix = replace(fix, applicability=Applicability.UNSAFE)
        message = (
            f"{subject} to `{function}` is not float32: {causes}; the kernel exponentiates "
            "prefix sums of the gate ring, so it must be float32"
        )
        if fix is None and any(not self._feeds_only_this(fact) for fact in wrong):
            message += (
                "; it is also read elsewhere, and a cast at the call would copy the ring, so "
                "the kernel's in-place writes would miss it: make it float32 where it is made"
            )
        self.report(located, message, fix=fix)

    def _fix(
        self, facts: tuple[TensorFact, ...], wrong: list[TensorFact], site: Site
    ) -> FixDraft | None:
        """The change at the one line that made the argument non-float32, when that value feeds
        this argument alone (see FIX)."""
        if len(wrong) != 1 or any(f is not wrong[0] and f.kind is not Kind.FLOAT32 for f in facts):
            return None
        fact = wrong[0]
        if fact.target is None or not self._feeds_only_this(fact):
            return None
        made = self.context.spelling.edits_for(fact.target, site)
        if made is None:
            return None
        edits, safe = made
        return FixDraft(
            f"Make it {self.float32(site)} where it is made",
            edits,
            Applicability.SAFE if safe else Applicability.UNSAFE,
        )

    def _feeds_only_this(self, fact: TensorFact) -> bool:
        return all(self.context.index.read_once(binding) for binding in fact.via)

    def _entry_point(self, call: cst.Call) -> EntryPoint | None:
        written = dotted_name(call.func)
        names = {written} if written else set()
        names |= self.context.qualified_names(call.func)
        for entry_point in self.context.entry_points:
            if any(entry_point.matches(name) for name in names):
                return entry_point
        return None

    def _cast_to_a_ring(
        self, fact: TensorFact, passed_rings: list[PassedValue]
    ) -> PassedValue | None:
        """The d or k ring the call passes whose dtype ``fact``'s cast takes (``g.to(d.dtype)``,
        ``g.type_as(d)``), when that ring is not provably float32: the d and k rings follow the
        model's dtype, so the cast makes the gate ring the model's dtype too."""
        if fact.kind is not Kind.CAST or fact.call is None:
            return None
        operand = _dtype_source(fact.call)
        if operand is None:
            return None
        for ring in passed_rings:
            if operand.deep_equals(ring.value):
                made = self.provenance.tensor_facts(ring.value, ring.site)
                if not made or any(f.kind is not Kind.FLOAT32 for f in made):
                    return ring
        return None

    def _unnamed_variable(self, fact: TensorFact, passed: PassedValue) -> bool:
        """A dtype that is not provably float32 (``dtype=cfg.torch_dtype``), on a way to the
        call through no name of a gate cache: where a gate-cache name holds it, RL002 reports it
        at the allocation; here (``*bufs[1:4]`` of a record of unnamed rings) nothing else does."""
        if fact.kind is not Kind.VARIABLE or fact.allocation is None:
            return False
        names = [use.value for use in fact.uses]
        if isinstance(passed.value, (cst.Name, cst.Attribute)):
            names.append(binding_name(passed.value) or "")
        return not any(self.context.gate_caches.matches(name) for name in names)

    def _spread(self, passed: PassedValue) -> str | None:
        """The spread that carries ``passed``, quoted (`` `*rings` ``, `` `**ring_args` ``);
        None for an argument written for it."""
        carrier = passed.argument
        if carrier.value is passed.value:
            return None
        return f"`{carrier.star}{one_line(self.context.module, carrier.value)}`"

    def _report_variable(self, call: cst.Call, passed: PassedValue, fact: TensorFact) -> None:
        """Where the dtype is chosen: the allocation's line, with the call that passes it."""
        function = one_line(self.context.module, call.func)
        how = self._spread(passed) or "its argument"
        dtype = one_line(self.context.module, fact.node)
        fix = self._fix((fact,), [fact], passed.site)
        self.report(
            fact.node,
            f"the gate cache {how} passes to `{function}` (line {self.context.line_of(call)}) "
            f"is allocated with dtype `{dtype}`, which is not provably float32; the kernel "
            "exponentiates prefix sums of the gate ring, so it must be float32",
            fix=fix,
        )

    def _cause(self, fact: TensorFact, ring: PassedValue | None = None) -> str:
        line = self.context.line_of(fact.node)
        if ring is not None:
            written = one_line(self.context.module, ring.value)
            return (
                f"line {line}: {fact.detail} casts it to the dtype of `{written}`, a ring this "
                "call passes, which follows the model's dtype"
            )
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


def _dtype_source(cast: cst.Call) -> cst.BaseExpression | None:
    """The tensor whose dtype ``cast`` takes: ``x`` of ``.to(x.dtype)``, ``.to(dtype=x.dtype)``,
    ``.type(x.dtype)``, ``.type_as(x)`` and ``.to(x)``."""
    func = cast.func
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    keyword = keyword_arg(cast, "dtype")
    positional = [arg.value for arg in cast.args if arg.keyword is None and not arg.star]
    if method == "type_as":
        return positional[0] if positional else None
    if method not in {"to", "type"}:
        return None
    operand = keyword.value if keyword is not None else positional[0] if positional else None
    if isinstance(operand, cst.Attribute) and operand.attr.value == "dtype":
        return operand.value
    return operand if method == "to" and keyword is None else None


def _provably_not_float32(fact: TensorFact) -> bool:
    if fact.kind is Kind.LOADED:
        return True
    return fact.kind in {Kind.EXPLICIT, Kind.CAST} and bool(fact.non_float32_literals)
