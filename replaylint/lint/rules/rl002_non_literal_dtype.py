"""RL002: a gate cache allocated with a dtype that is not provably float32."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.dtype_records import gate_field_arguments
from replaylint.lint.dataflow.dtype_tables import borrowed_gate_dtype, chosen_by_gate_setting
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.dataflow.scopes import all_params
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.declared_settings import declared_setting, keyword_only_setting
from replaylint.lint.rules.record_tables import (
    report_gate_following_ring,
    report_gate_sharing_ring,
    report_zipped_entries,
)
from replaylint.lint.rules.setting_examples import SETTING_INVALID, SETTING_VALID
from replaylint.lint.rules.wording import (
    FIX_SAFETY,
    WHY,
    describe_dtype,
    is_spread,
    reported_at,
    through,
)
from replaylint.lint.syntax.nodes import one_line


class NonLiteralDtype(Rule):
    SUMMARY = "A gate cache is allocated with a dtype that is not provably float32."
    RATIONALE = """\
The gate cache stores per-step log-decays; the ReplaySSM kernel sums them and exponentiates the
sums (`exp(G_T - G_j)`), so an absolute rounding error in `g` becomes a relative error in every
decay, and the checkpoint term `S0 * exp(G_T)` carries it into the state at each flush, where it
compounds. bfloat16 keeps about 8 significant bits: ~1.5% decay error per step at ring length 16,
tens of percent once prefix sums are stored. So the gate ring is float32 whatever the model dtype.

The classic way to break this is to allocate the gate ring like its neighbours: `dtype=ring_dtype`,
`dtype=self.dtype`, `dtype=config.torch_dtype`, a `dtype` parameter, `dtype=x.dtype`. Those are
right for the d and k rings, which follow the model dtype, and wrong for g — and nothing fails:
the model just drifts. This rule follows the dtype inside the function: a local bound to
`torch.float32` is fine, a conditional whose branches are all float32 is fine, `x.dtype` of a
tensor known to be float32 is fine. A local bound to a literal such as `torch.bfloat16` is
reported by RL001 instead (it is then an explicit dtype), so one allocation never gets both codes.

A setting named for the gate cache's dtype (`gate_dtype`, `log_decay_dtype`, `gate_ring_dtype`)
that is given the dtype of another setting — `self.log_decay_dtype = self.dtype`,
`Config(gate_dtype=args.cache_dtype)`, the fallback of `DTYPES.get(flag, self.dtype)` or of
`gate_dtype or dtype`, an entry of a dtype table picked by a setting that is not the gate's own
(`log_decay_dtype=DTYPE_BY_NAME[config.cache_precision]`) — is reported where it is set, when that dtype is not provably float32. A
setting float32 by its role (`state_dtype`, `acc_dtype`) is not another setting's dtype here. A
ring allocated with such a setting (`dtype=spec.gate_dtype`) whose only declarations in the module
are class fields with a literal dtype default, never reassigned, is judged at that declaration
(RL001 reports a `torch.bfloat16` default there), not once more at every allocation; so is the
gate field of a record of ring dtypes a parameter is annotated with (`dtypes: RingDtypes`, then
`dtype=dtypes.logdecay`), which every construction of the record decides. A field
annotated as a dtype and named like the gate cache itself (`decay_ring: torch.dtype =
torch.bfloat16` in a record of the rings' dtypes) is such a setting too.

In a run over a project, a dtype imported from another module of the project is followed to its
definition (constants, aliases, re-exports, functions, string tables, class constants and
properties; see RL001): one that is float32 there is not reported, one that is a literal such as
`torch.bfloat16` there is RL001's, with the file and line it was written at. What cannot be
followed with certainty (a name rebound under a condition, a field of an instance built elsewhere
whose default is not float32) stays a dtype that is not provably float32, reported here.
"""
    FIX = (
        """\
Replaces the dtype expression with `torch.float32` (spelled with the module's alias for torch;
`import torch` is added when missing). The fix is **safe**, in the same sense as RL001's: it
changes the gate cache's dtype and nothing else. The expression it replaces only chose that dtype —
a `dtype` parameter, `self.dtype` or `ring_dtype` keeps its value for every other use, such as the
d and k rings — and the only dtype a ReplaySSM gate ring may have is float32: the decode kernel
rejects any other. If the value was float32 at run time already, nothing changes. (Code that
deliberately keeps a float64 gate ring for a reference computation should say so with
`# noqa: RL002`.)
"""
        + FIX_SAFETY
        + """
A gate-dtype setting given another setting's dtype is made `torch.float32` where it is set; that
fix is **unsafe**: whatever else reads the setting sees float32 too.
"""
    )
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        *SETTING_VALID,
        Valid(
            """
            import torch

            GATE_DTYPE = torch.float32

            class ReplayCache:
                def __init__(self, shape, dtype, gate_dtype=GATE_DTYPE):
                    # the helper's own choice is float32; a call that passes another dtype is
                    # where that would be wrong, and these calls pass what cannot be told here
                    self.d_cache = torch.zeros(shape, dtype=dtype)
                    self.g_cache = torch.zeros(shape, dtype=gate_dtype)

                @classmethod
                def resized(cls, cache, shape, **kwargs):
                    return cls(shape, cache.d_cache.dtype, **kwargs)
            """
        ),
        Valid(
            """
            import torch

            def cache_config(args, gate_dtype=torch.float32):
                # the state is float32 by its role; a gate dtype passed on is judged where it is set
                return dict(ring_dtype=args.dtype, gate_dtype=gate_dtype, state_dtype=args.state_dtype)
            """
        ),
        Valid(
            """
            import torch
            # d and k follow the ring dtype; g is float32
            ring_dtype = conv_dtype if spec else ssm_dtype
            d_cache = torch.zeros(slots, hv, ring, v, dtype=ring_dtype)
            k_cache = torch.zeros(slots, h, ring, k, dtype=ring_dtype)
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32)
            """
        ),
        Valid(
            """
            import torch

            def make_gate_ring(shape, device):
                dtype = torch.float32
                return {"g_cache": torch.zeros(shape, dtype=dtype, device=device)}
            """
        ),
        Valid(
            """
            import torch

            def allocate(shape, exact):
                # every branch is float32
                dtype = torch.float32 if exact else torch.float
                g_cache = torch.empty(shape, dtype=dtype)
                return g_cache
            """
        ),
        Valid(
            """
            import torch

            def grow(self, slots):
                # the dtype of another gate cache is float32 (it is checked where it is bound)
                self.g_cache = torch.zeros(
                    slots, *self.g_cache.shape[1:], dtype=self.g_cache.dtype
                )
            """
        ),
        Valid(
            """
            import torch

            def restore(self, g_cache):
                # copying into an existing float32 gate cache casts on the way in
                self.g_cache.copy_(g_cache)
            """
        ),
        Valid(
            """
            import torch
            from dataclasses import dataclass

            @dataclass(frozen=True)
            class RingConfig:
                slots: int
                gate_dtype: torch.dtype = torch.float32

            class Pool:
                GATE_DTYPE = torch.float32

                def __init__(self, config: RingConfig, shape):
                    # a class constant and a config field default, both float32
                    self.g_cache = torch.zeros(shape, dtype=self.GATE_DTYPE)
                    self.replayssm_g = torch.zeros(shape, dtype=config.gate_dtype)
            """
        ),
        Valid(
            """
            import torch

            def _gate_ring(shape, dtype=torch.float32):
                # no call in the module passes a dtype: the default holds
                return {"g_cache": torch.zeros(shape, dtype=dtype)}

            def build(shape):
                return _gate_ring(shape)
            """
        ),
        Valid(
            """
            import torch
            torch.set_default_dtype(torch.float32)
            g_cache = torch.zeros(4, 16, dtype=torch.get_default_dtype())
            """
        ),
        Valid(
            """
            import torch

            class GraphRunner:
                # a compiled-graph cache named `g_cache`: a dict read with `.get`, emptied with
                # `.clear()`, which no tensor has; not a gate cache
                def __init__(self, dtype, sizes):
                    self.g_cache = {bs: torch.empty(bs, 16, dtype=dtype) for bs in sizes}

                def replay(self, bs):
                    return self.g_cache.get(bs)

                def reset(self):
                    self.g_cache.clear()
            """
        ),
        Valid(
            """
            from typing import NamedTuple

            import torch

            class ReplaySpec(NamedTuple):
                slots: int
                dtype: torch.dtype = torch.bfloat16
                gate_dtype: torch.dtype = torch.float32

            def allocate(spec, shape):
                # `spec` has no annotation, but the module declares `gate_dtype` once, as a
                # field with a literal default that nothing reassigns: that line decides
                g_cache = torch.zeros(shape, dtype=spec.gate_dtype)
                return g_cache
            """
        ),
        Valid(
            """
            from typing import NamedTuple

            import torch

            class RingSpec(NamedTuple):
                name: str
                dtype: torch.dtype

            RINGS = (RingSpec("d_cache", torch.bfloat16), RingSpec("g_cache", torch.float32))

            def allocate(shape):
                # the table's gate entry says float32
                spec = RINGS[1]
                g_cache = torch.zeros(shape, dtype=spec.dtype)
                return g_cache
            """
        ),
        Valid(
            """
            import torch

            def make_gate_ring(slots, dtype=None):
                # no call of the module passes `dtype`: it is None, and the ring float32
                g_cache = torch.zeros(slots, 16, dtype=dtype or torch.float32)
                return g_cache

            rings = [make_gate_ring(4), make_gate_ring(slots=8)]
            """
        ),
        Valid(
            """
            import torch

            def gate_ring(shape, dtype):
                return {"g_cache": torch.zeros(shape, dtype=dtype)}

            # the module's only call passes float32
            rings = gate_ring((4, 16), torch.float32)
            """
        ),
        Valid(
            """
            import torch

            class ChunkGate(torch.autograd.Function):
                @staticmethod
                def forward(ctx, g):
                    # the gate tensor's own dtype, kept to cast the gradient back: no setting
                    ctx.g_dtype = g.dtype
                    return g.float().cumsum(-1)
            """
        ),
    )
    INVALID = (
        *SETTING_INVALID,
        Invalid(
            """
            import torch
            ring_dtype = conv_dtype if spec else ssm_dtype
            replayssm_g = torch.zeros(size=g_shape, dtype=ring_dtype, device=device)
            """,
            expected_fix="""
            import torch
            ring_dtype = conv_dtype if spec else ssm_dtype
            replayssm_g = torch.zeros(size=g_shape, dtype=torch.float32, device=device)
            """,
            message_contains="`ring_dtype` (line 2: `conv_dtype if spec else ssm_dtype`)",
        ),
        Invalid(
            """
            import torch as th

            class Pool:
                def __init__(self, config, shape):
                    self.g_cache = th.empty(shape, dtype=config.torch_dtype)
            """,
            expected_fix="""
            import torch as th

            class Pool:
                def __init__(self, config, shape):
                    self.g_cache = th.empty(shape, dtype=th.float32)
            """,
            message_contains="`config.torch_dtype`",
        ),
        Invalid(
            """
            import torch

            def make_caches(shape, dtype):
                return {
                    "d_cache": torch.zeros(shape, dtype=dtype),
                    "g_cache": torch.zeros(shape, dtype=dtype),
                }
            """,
            expected_fix="""
            import torch

            def make_caches(shape, dtype):
                return {
                    "d_cache": torch.zeros(shape, dtype=dtype),
                    "g_cache": torch.zeros(shape, dtype=torch.float32),
                }
            """,
            message_contains="`dtype`, a parameter",
        ),
        Invalid(
            """
            import torch

            def snapshot_ring(d_cache, shape):
                g_cache = d_cache.new_zeros(shape, dtype=d_cache.dtype)
                return g_cache
            """,
            expected_fix="""
            import torch

            def snapshot_ring(d_cache, shape):
                g_cache = d_cache.new_zeros(shape, dtype=torch.float32)
                return g_cache
            """,
        ),
        Invalid(
            """
            from torch import zeros

            def build(shape, half):
                dtype = model_dtype if half else torch_dtype
                self.replayssm_g = zeros(shape, dtype=dtype)
            """,
            expected_fix="""
            import torch
            from torch import zeros

            def build(shape, half):
                dtype = model_dtype if half else torch_dtype
                self.replayssm_g = zeros(shape, dtype=torch.float32)
            """,
        ),
        Invalid(
            """
            import torch

            class Pool:
                def __init__(self, layers, shape, device):
                    self.d_caches = [torch.zeros(shape, dtype=self.dtype) for _ in range(layers)]
                    self.g_caches = [torch.zeros(shape, dtype=self.dtype) for _ in range(layers)]
            """,
            expected_fix="""
            import torch

            class Pool:
                def __init__(self, layers, shape, device):
                    self.d_caches = [torch.zeros(shape, dtype=self.dtype) for _ in range(layers)]
                    self.g_caches = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]
            """,
            message_contains="`self.dtype`",
        ),
        Invalid(
            """
            import torch

            def build(shape, device, dtype):
                factory_kwargs = {"device": device}
                factory_kwargs["dtype"] = dtype
                g_cache = torch.empty(shape, **factory_kwargs)
                return g_cache
            """,
            expected_fix="""
            import torch

            def build(shape, device, dtype):
                factory_kwargs = {"device": device}
                factory_kwargs["dtype"] = dtype
                g_cache = torch.empty(shape, **{**factory_kwargs, "dtype": torch.float32})
                return g_cache
            """,
            message_contains="`factory_kwargs`, whose `dtype` entry is `dtype`, a parameter",
        ),
        Invalid(
            """
            import torch

            class ReplayCache:
                def __init__(self, shape, dtype, gate_dtype=torch.float32):
                    self.d_cache = torch.zeros(shape, dtype=dtype)
                    self.g_cache = torch.zeros(shape, dtype=gate_dtype)

                @classmethod
                def from_config(cls, config, shape):
                    # reported here: the class is right to take a gate dtype, this call is not
                    return cls(shape, config.dtype, gate_dtype=config.dtype)
            """,
            expected_fix="""
            import torch

            class ReplayCache:
                def __init__(self, shape, dtype, gate_dtype=torch.float32):
                    self.d_cache = torch.zeros(shape, dtype=dtype)
                    self.g_cache = torch.zeros(shape, dtype=torch.float32)

                @classmethod
                def from_config(cls, config, shape):
                    # reported here: the class is right to take a gate dtype, this call is not
                    return cls(shape, config.dtype, gate_dtype=torch.float32)
            """,
            message_contains="a parameter that the call at line 11 passes as `config.dtype`",
        ),
    )

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._settings: list[cst.CSTNode] = []  # statements of reported gate-dtype settings
        self._getters: set[str] = set()  # reported getters: `spec.<getter>` is reported there

    # -------------------------------------- a gate-dtype setting given another setting's dtype
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1:
            self._borrowed(node.targets[0].target, node.value)
            report_gate_following_ring(self, node.targets[0].target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._borrowed(node.target, node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        self._borrowed(node.keyword, node.value)

    def visit_Call(self, node: cst.Call) -> None:
        report_zipped_entries(self, node, Kind.VARIABLE)
        # `CacheRecipe(state, ring, ring, ring)`: the gate ring's field of a record of dtypes
        for gate in gate_field_arguments(self.provenance, node):
            if gate.passed == "keyword" and self.context.gate_caches.names_gate_dtype(gate.field):
                continue  # a keyword named for the gate dtype is a setting: `visit_Arg`
            record = self.context.module.code_for_node(node.func).strip()
            subject = f"`{gate.field}` of `{record}`, the gate ring's dtype,"
            if not self._borrowed(None, gate.value, gate_field=gate.field, subject=subject):
                report_gate_sharing_ring(self, node, gate)

    def visit_Return(self, node: cst.Return) -> None:
        # `def log_decay_dtype(self): return self.checkpoint_dtype`: a getter is a setting too
        # (one that returns its argument passes its caller's choice on)
        scope = self.site().scope
        if (
            isinstance(scope, cst.FunctionDef)
            and not _returns_an_argument(scope, node.value)
            and self._borrowed(scope.name, node.value, verb="returns")
        ):
            self._getters.add(scope.name.value)

    def _borrowed(
        self,
        target: cst.CSTNode | None,
        value: cst.BaseExpression | None,
        verb: str = "is set to",
        gate_field: str | None = None,
        subject: str | None = None,
    ) -> bool:
        """Report a gate-dtype setting given another setting's dtype; whether it was one."""
        site = self.site()
        found = borrowed_gate_dtype(self.provenance, target, value, site, gate_field=gate_field)
        if found is None:
            return False
        name, borrowed = found
        statement = site.statement
        if statement is not None:
            within = self.provenance.within
            if any(d.code == self.CODE and within(d.node, statement) for d in self.context.drafts):
                return True  # the parameter this setting reaches is reported on its line already
            if any(d.code == "RL001" and within(d.node, statement) for d in self.context.drafts):
                return True  # the setting resolves to a literal, reported as that
            self._settings.append(statement)
        fix = self.setting_fix(borrowed, site)
        whose = (
            "an entry of a dtype table that another setting picks"
            if isinstance(borrowed, cst.Subscript)
            else "the dtype of another setting"
        )
        subject = subject or f"`{name}`, named for the gate cache's dtype,"
        self.report(
            borrowed,
            f"{subject} {verb} "
            f"`{one_line(self.context.module, borrowed)}`, {whose}, which is "
            f"not provably float32; {WHY}",
            fix=fix,
        )
        return True

    def _in_reported_setting(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is in the statement of a gate-dtype setting reported already."""
        return any(self.provenance.within(node, statement) for statement in self._settings)

    def check_binding(self, binding: GateCacheBinding) -> None:
        for fact in self.facts(binding):
            if fact.kind is not Kind.VARIABLE:
                continue
            source = describe_dtype(
                self.context, fact.node, fact.dtypes, through_mapping=is_spread(fact)
            )
            allocation = fact.allocation
            if (
                allocation is not None
                and allocation.dtype_arg is not None
                and isinstance(fact.node, cst.Call)
                and fact.node is not allocation.call
            ):  # made by a helper other calls share: the finding is about this call
                dtype = describe_dtype(self.context, allocation.dtype_arg.value, fact.dtypes)
                line = self.context.line_of(allocation.call)
                source = f"{dtype} by `{one_line(self.context.module, fact.node)}` (line {line})"
            fix = self.fix_for(
                binding, fact, fact.target, "Allocate it as {float32}", Applicability.SAFE
            )
            at = reported_at(fact)
            if self._in_reported_setting(at) or (
                isinstance(at, cst.Attribute) and at.attr.value in self._getters
            ):
                continue  # reported as the gate-dtype setting (or getter) that borrowed it
            if declared_setting(self.context, self.provenance.index, fact.node):
                continue  # judged where the setting is declared (RL001 for a non-float32 one)
            if keyword_only_setting(self.context, fact):
                continue  # `*, log_decay_dtype=None`: each call's keyword is the setting
            if chosen_by_gate_setting(self.provenance, fact.dtypes):
                continue  # `Cache(decay_dtype=TABLE[opt.decay_dtype])`: judged at that setting
            self.report(
                at,
                f"{self.subject(binding)} is allocated with dtype {source}, which is not provably "
                f"float32{through(self.context, fact)}; {WHY}{self.withheld(binding, fact)}",
                fix=fix,
            )


def _returns_an_argument(function: cst.FunctionDef, value: cst.BaseExpression | None) -> bool:
    """Whether ``value`` is one of ``function``'s parameters (``return wire_dtype``)."""
    return isinstance(value, cst.Name) and any(
        p.name.value == value.value for p in all_params(function.params)
    )
