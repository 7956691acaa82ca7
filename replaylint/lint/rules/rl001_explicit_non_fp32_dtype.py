"""RL001: a gate cache allocated with an explicit dtype other than float32."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.dtype_tables import chosen_by_gate_setting
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.config_settings import (
    CONFIG_INVALID,
    CONFIG_VALID,
    report_config_entries,
)
from replaylint.lint.rules.gate_dtype_settings import (
    SETTING_INVALID,
    SETTING_VALID,
    report_returned_setting,
    report_setting,
    report_unpacked_settings,
)
from replaylint.lint.rules.record_tables import (
    RECORD_INVALID,
    RECORD_VALID,
    report_narrow_gate_fields,
    report_zipped_entries,
)
from replaylint.lint.rules.ring_word_tables import (
    RING_WORD_INVALID,
    RING_WORD_VALID,
    ring_word_entries,
)
from replaylint.lint.rules.wording import (
    FIX_SAFETY,
    WHY,
    binding_lines,
    literal_names,
    reported_at,
    through,
)


class ExplicitNonFp32Dtype(Rule):
    SUMMARY = "A gate cache is allocated with an explicit dtype that is not float32."
    RATIONALE = """\
The ReplaySSM gate cache (`g_cache`, `[slots, HV, L, K]`) stores per-step log-decays. The decode
kernel takes their prefix sums `G_j` and exponentiates differences, `exp(G_T - G_j)`, to rebuild
the recurrent state from the checkpoint. An absolute error in `G` becomes a relative error in the
decay: bfloat16 keeps about 8 significant bits, so storing `g` in bf16 already puts ~1.5% error
into the decays at ring length 16, and float16 overflows once a prefix sum passes -65504. The
`S0 * exp(G_T)` term is written back into the checkpoint at every flush, so the error compounds
over the sequence instead of staying one token of noise. The d and k rings follow the model dtype;
the gate ring must be float32 whatever the model dtype is.

Recognised allocations: `torch.empty/zeros/ones/full/rand/randn/empty_strided/tensor/as_tensor/
linspace/logspace/eye`, `torch.arange` with a `dtype=`, the `*_like` forms and `x.new_empty/
new_zeros/new_ones/new_full/new_tensor`, through any import alias, also when wrapped in
`nn.Parameter(...)` or followed by calls that keep the dtype (`.to(device)`, `.contiguous()`).
Every dtype spelling is understood (`torch.half` is float16, `torch.float` float32). The dtype is
followed through local bindings (`ring_dtype = torch.bfloat16`, then `dtype=ring_dtype`; a
non-literal dtype is RL002's, so an allocation never gets both codes), a conditional with a bf16
branch is reported, and a dtype parameter that a call of the module fills with a bf16 literal is
reported at that call (`make_rings(shape, torch.bfloat16)`), fixed at the allocation.

The allocation is found behind the expressions that keep its dtype: arithmetic with Python numbers
(`-torch.rand(...) * 0.1`), elementwise functions (`F.logsigmoid`, `torch.exp`, `.cumsum(-1)`),
and joins (`torch.stack`, `torch.cat`) whose parts are all non-float32 (a float32 part promotes a
join or a product to float32, so `torch.cat([self.g_cache, bf16_padding])` is fine). It is
followed into what the module calls: a method or function that returns (or a generator that
yields) the allocation, `functools.partial(torch.zeros, dtype=...)` and lambda allocators, and
dataclass fields `field(default_factory=...)`. A gate cache is recognised in every binding form:
`self.g_caches.append(...)`, `self.g_caches += [...]`, `caches.setdefault("g_cache", ...)` and
`object.__setattr__(self, "g_cache", ...)`, parameter defaults (`def __init__(self,
g_cache=torch.zeros(...))`), `self.g_caches[layer] = ...` on a list of rings, f-string buffer
names outside a loop over names or numbered by a `range`/`enumerate` counter
(`register_buffer(f"layer{i}_g_cache", ...)`), a NamedTuple or dataclass of the module built in
field order (`KDALayerState(d, k, torch.zeros(...))`), and one element of a tuple
(`self.d_cache, self.g_cache = self._rings(shape)`, where only that element is read) included.
The rings a loop takes from a generator or a list of the module (`for ring in self._rings():
self.g_caches.append(ring)`) are followed too; that finding has no fix, since the iterable may
hold more than the gate rings.

Across modules: in a run over a project (the command line, the language server), a dtype imported
from another module of the project is followed to where it is defined — a module constant
(`from .policy import WIRE_DTYPE`, `import pkg.policy as m; m.WIRE_DTYPE`, aliases of aliases,
re-exports through a package's `__init__`, relative imports), a function that returns a dtype
(`gate_ring_dtype()`, a constant, a lookup in a string table with a known key), a string table
entry (`STR_DTYPE_TO_TORCH_DTYPE[flag]`), a class constant, a dataclass field of an instance built
right there (`CacheConfig().ring_dtype`) or a property that returns a dtype. The message names the
file and line the dtype was written at; the fix is made at the allocation. A name defined under a
condition, bound twice or mutated in place is not followed; a field of an instance built elsewhere
(`cfg.ring_dtype`, `cfg: CacheConfig`) vouches only for float32. Stdin reads only itself.

Allocation helpers of the project are followed too: `alloc_ring(shape, torch.bfloat16)` of a
helper that allocates with its `dtype` parameter (fixed at the call's argument), a helper with a
fixed non-float32 dtype (its result is cast at the call), and other modules' partials or lambdas.

A setting named for the gate cache's dtype (`gate_dtype`, `g_dtype`, `gate_ring_dtype`,
`<gate cache>_dtype`) that holds a non-float32 literal is reported where it is written: a field
default (`gate_dtype: torch.dtype = torch.bfloat16`), a parameter default, a keyword argument or an
assignment in a function or class. A constant (`GATE_RING_DTYPE`) or a module-level setting is a
policy: it is reported where a gate cache is made with it, in its own module or an importer. A
string that names a dtype is a setting too (`gate_dtype="bf16"`, `"torch.float16"`, `"amp_bf16"`),
and so is the entry of a config literal whose key is named for the gate dtype, anywhere:
`{"decode_cache": {"gate_dtype": "${decode_cache.ring_dtype}"}}` follows OmegaConf's
interpolations (absolute, or relative with leading dots) inside the literal to the string they
reach. The string fix names float32 in the setting's own vocabulary (`"fp32"`, `"float32"`,
`"torch.float32"`; for an interpolation, the config's own float32 spelling).
"""
    FIX = (
        """\
Replaces the dtype with `torch.float32`, spelled with the module's own alias for torch (`th.float32`
after `import torch as th`; `import torch` is added when the module has no binding for it). The fix
is **safe**: it changes only the gate cache's dtype, which the kernel requires to be float32; every
reader of the cache either expects float32 or casts. A setting named for the gate cache's dtype is
set to `torch.float32` too, but **unsafe**: its name says what it is for, its readers are not
checked.
"""
        + FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE
    _dict_depth = 0  # dict literals entered: only the outermost is read as a config

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._tables: list[tuple[cst.BaseExpression, str, FixDraft | None]] = []
        self._judged: set[int] = set()  # dtype literals reported where an allocation reads them

    VALID = (
        *RECORD_VALID,
        *CONFIG_VALID,
        *RING_WORD_VALID,
        *SETTING_VALID,
        Valid(
            """
            import torch

            def replay_states(dtype, gate_dtype: torch.dtype = torch.float32):
                # the other states' settings follow the model; the gate ring's is float32
                ssm_dtype = torch.bfloat16
                return dtype, ssm_dtype, gate_dtype
            """
        ),
        Valid(
            """
            import torch
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32, device=device)
            # torch.float is float32
            self.g_cache = torch.empty(shape, dtype=torch.float)
            """
        ),
        Valid(
            """
            import torch
            # d and k follow the model dtype: not gate caches
            d_cache = torch.zeros(slots, hv, ring, v, dtype=torch.bfloat16)
            k_cache = torch.zeros(slots, h, ring, k, dtype=torch.bfloat16)
            """
        ),
        Valid(
            """
            import torch
            # `g`, `gate`, `log_g` are per-token tensors, not the ReplaySSM ring
            g = torch.zeros(b, hv, k, dtype=torch.bfloat16)
            log_g = torch.empty(b, hv, k, dtype=torch.bfloat16)
            conditioning_cache = torch.zeros(n, dtype=torch.float16)
            """
        ),
        Valid(
            """
            import torch
            # cast back to float32 afterwards: the result is float32
            g_cache = torch.zeros(shape, dtype=torch.bfloat16).float()
            """
        ),
        Valid(
            """
            import torch

            def make_gate_ring(shape, device):
                # a local bound to float32 resolves to float32
                dtype = torch.float32
                return {"g_cache": torch.zeros(shape, dtype=dtype, device=device)}
            """
        ),
        Valid(
            """
            import torch
            # integer and bool tensors are indices and masks, not log-decay rings
            gate_cache = torch.zeros(tokens, top_k, dtype=torch.long)
            expert_gate_cache = torch.zeros(tokens, dtype=torch.bool)
            """
        ),
        Valid(
            """
            import torch

            def grow(self, extra):
                # a float32 part promotes the join: cat of the ring with bf16 padding is float32
                padding = torch.zeros(extra, dtype=torch.bfloat16)
                self.g_cache = torch.cat([self.g_cache, padding])
                self.replayssm_g = torch.where(self.mask, self.g_cache, 0.0)
            """
        ),
        Valid(
            """
            import functools
            import torch

            alloc = functools.partial(torch.zeros, dtype=torch.float32)

            class Pool:
                def __init__(self, shape):
                    # the call's own dtype is the d ring's alone; the gate ring keeps float32
                    self.d_cache = alloc(shape, dtype=torch.bfloat16)
                    self.g_cache = -alloc(shape) * 0.5
                    self.g_caches = list(self._rings(shape))

                def _rings(self, shape):
                    for _ in range(2):
                        yield torch.empty(shape, dtype=torch.float32)
            """
        ),
        Valid(
            """
            import torch

            class LinearAttnCache:
                def _rings(self, shape, dtype):
                    # the d ring follows the model dtype; the gate ring, unpacked second, is fp32
                    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=torch.float32)

                def __init__(self, shape):
                    self.d_cache, self.g_cache = self._rings(shape, torch.bfloat16)
            """
        ),
    )
    INVALID = (
        *RING_WORD_INVALID,
        Invalid(
            """
            import torch
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.bfloat16, device=device)
            """,
            expected_fix="""
            import torch
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32, device=device)
            """,
            message_contains="bfloat16",
        ),
        Invalid(
            """
            import torch as th
            self.replayssm_g = th.empty(shape, dtype=th.half)
            """,
            expected_fix="""
            import torch as th
            self.replayssm_g = th.empty(shape, dtype=th.float32)
            """,
            message_contains="float16",
        ),
        Invalid(
            """
            from torch import bfloat16, zeros
            caches = {"g_cache": zeros(4, 16, 128, dtype=bfloat16)}
            """,
            expected_fix="""
            import torch
            from torch import bfloat16, zeros
            caches = {"g_cache": zeros(4, 16, 128, dtype=torch.float32)}
            """,
        ),
        Invalid(
            """
            import torch
            pool["layer0_g_cache"] = torch.nn.Parameter(
                torch.zeros(shape, dtype=torch.double), requires_grad=False
            ).to(device)
            """,
            expected_fix="""
            import torch
            pool["layer0_g_cache"] = torch.nn.Parameter(
                torch.zeros(shape, dtype=torch.float32), requires_grad=False
            ).to(device)
            """,
            message_contains="float64",
        ),
        Invalid(
            """
            import torch
            self.register_buffer("gate_cache", d_cache.new_zeros(shape, dtype=torch.float16))
            """,
            expected_fix="""
            import torch
            self.register_buffer("gate_cache", d_cache.new_zeros(shape, dtype=torch.float32))
            """,
        ),
        Invalid(
            """
            import torch

            def make_rings(shape):
                # a local bound to a literal resolves to it: explicit, so RL001 (not RL002)
                ring_dtype = torch.bfloat16
                d_cache = torch.zeros(shape, dtype=ring_dtype)
                g_cache = torch.zeros(shape, dtype=ring_dtype)
                return d_cache, g_cache
            """,
            expected_fix="""
            import torch

            def make_rings(shape):
                # a local bound to a literal resolves to it: explicit, so RL001 (not RL002)
                ring_dtype = torch.bfloat16
                d_cache = torch.zeros(shape, dtype=ring_dtype)
                g_cache = torch.zeros(shape, dtype=torch.float32)
                return d_cache, g_cache
            """,
            message_contains="(through `ring_dtype`, line 5)",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            def init_gates(shape):
                # arithmetic and elementwise functions keep the allocation's dtype
                g_cache = F.logsigmoid(-torch.rand(shape, dtype=torch.bfloat16) * 0.1)
                return g_cache
            """,
            expected_fix="""
            import torch
            import torch.nn.functional as F

            def init_gates(shape):
                # arithmetic and elementwise functions keep the allocation's dtype
                g_cache = F.logsigmoid(-torch.rand(shape, dtype=torch.float32) * 0.1)
                return g_cache
            """,
        ),
        Invalid(
            """
            import torch

            class Pool:
                def __init__(self, layers, shape):
                    self.g_caches = []
                    for _ in range(layers):
                        self.g_caches.append(torch.zeros(shape, dtype=torch.float16))
                    self.g_caches += [torch.stack([torch.zeros(shape, dtype=torch.float16)] * 2)]
            """,
            expected_fix="""
            import torch

            class Pool:
                def __init__(self, layers, shape):
                    self.g_caches = []
                    for _ in range(layers):
                        self.g_caches.append(torch.zeros(shape, dtype=torch.float32))
                    self.g_caches += [torch.stack([torch.zeros(shape, dtype=torch.float32)] * 2)]
            """,
        ),
        Invalid(
            """
            import functools
            import torch

            alloc = functools.partial(torch.empty, dtype=torch.bfloat16)

            class Pool:
                def __init__(self, shape):
                    # the partial is shared: the gate-cache call overrides its dtype
                    self.d_cache = alloc(shape)
                    self.g_cache = alloc(shape)
            """,
            expected_fix="""
            import functools
            import torch

            alloc = functools.partial(torch.empty, dtype=torch.bfloat16)

            class Pool:
                def __init__(self, shape):
                    # the partial is shared: the gate-cache call overrides its dtype
                    self.d_cache = alloc(shape)
                    self.g_cache = alloc(shape, dtype=torch.float32)
            """,
        ),
        Invalid(
            """
            import torch

            class Pool:
                def __init__(self, shape):
                    self.g_cache = self._ring(shape)
                    self.d_cache = self._ring(shape)

                def _ring(self, shape):
                    # called for two caches: the gate cache's call is cast
                    return torch.zeros(shape, dtype=torch.bfloat16)
            """,
            expected_fix="""
            import torch

            class Pool:
                def __init__(self, shape):
                    self.g_cache = self._ring(shape).to(torch.float32)
                    self.d_cache = self._ring(shape)

                def _ring(self, shape):
                    # called for two caches: the gate cache's call is cast
                    return torch.zeros(shape, dtype=torch.bfloat16)
            """,
        ),
        Invalid(
            """
            from dataclasses import dataclass, field
            import torch

            @dataclass
            class RingState:
                g_cache: torch.Tensor = field(
                    default_factory=lambda: torch.zeros(4, 16, dtype=torch.bfloat16)
                )
            """,
            expected_fix="""
            from dataclasses import dataclass, field
            import torch

            @dataclass
            class RingState:
                g_cache: torch.Tensor = field(
                    default_factory=lambda: torch.zeros(4, 16, dtype=torch.float32)
                )
            """,
        ),
        Invalid(
            """
            import torch

            class FrozenPool:
                def __init__(self, shape):
                    object.__setattr__(self, "g_cache", torch.zeros(shape, dtype=torch.half))
            """,
            expected_fix="""
            import torch

            class FrozenPool:
                def __init__(self, shape):
                    object.__setattr__(self, "g_cache", torch.zeros(shape, dtype=torch.float32))
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn

            class LayerState(nn.Module):
                def __init__(self, layer, shape, g_cache=torch.zeros(1, dtype=torch.bfloat16)):
                    super().__init__()
                    self.register_buffer(f"layer{layer}_g_cache", torch.zeros(shape, dtype=torch.half))
            """,
            expected_fix="""
            import torch
            from torch import nn

            class LayerState(nn.Module):
                def __init__(self, layer, shape, g_cache=torch.zeros(1, dtype=torch.float32)):
                    super().__init__()
                    self.register_buffer(f"layer{layer}_g_cache", torch.zeros(shape, dtype=torch.float32))
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn

            class LayerRings(nn.Module):
                def __init__(self, layers, shape):
                    super().__init__()
                    for i in range(layers):
                        # a counter only numbers the name: every iteration is a gate buffer
                        self.register_buffer(f"layer{i}_g_cache", torch.zeros(shape, dtype=torch.bfloat16))
            """,
            expected_fix="""
            import torch
            from torch import nn

            class LayerRings(nn.Module):
                def __init__(self, layers, shape):
                    super().__init__()
                    for i in range(layers):
                        # a counter only numbers the name: every iteration is a gate buffer
                        self.register_buffer(f"layer{i}_g_cache", torch.zeros(shape, dtype=torch.float32))
            """,
        ),
        Invalid(
            """
            import torch

            class LinearAttnCache:
                def _rings(self, shape):
                    return torch.zeros(shape), torch.zeros(shape, dtype=torch.bfloat16)

                def __init__(self, shape):
                    self.d_cache, self.g_cache = self._rings(shape)
            """,
            expected_fix="""
            import torch

            class LinearAttnCache:
                def _rings(self, shape):
                    return torch.zeros(shape), torch.zeros(shape, dtype=torch.float32)

                def __init__(self, shape):
                    self.d_cache, self.g_cache = self._rings(shape)
            """,
            message_contains="self.g_cache",
        ),
        Invalid(
            """
            import torch

            class InferenceCache:
                def _layer_rings(self, shape, layers):
                    for _ in range(layers):
                        yield torch.empty(shape, dtype=torch.float16)

                def allocate(self, shape, layers):
                    self.g_caches = []
                    for ring in self._layer_rings(shape, layers):
                        self.g_caches.append(ring)
            """,
            message_contains="torch.float16",
        ),
        *RECORD_INVALID,
        *CONFIG_INVALID,
        *SETTING_INVALID,
    )

    # ---------------------------------------------- a dtype named for the gate cache
    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if len(self.site().scopes) > 1:  # at module level: a policy, judged where it is used
            self._gate_dtype(node.target, node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and len(self.site().scopes) > 1:
            self._gate_dtype(node.targets[0].target, node.value)
            report_unpacked_settings(self, node)

    def visit_Param(self, node: cst.Param) -> None:
        self._gate_dtype(node.name, node.default)

    def visit_Arg(self, node: cst.Arg) -> None:
        self._gate_dtype(node.keyword, node.value)

    def visit_Return(self, node: cst.Return) -> None:
        report_returned_setting(self, node)

    def visit_Dict(self, node: cst.Dict) -> None:
        if not self._dict_depth:  # a config literal: its nested literals are read with it
            report_config_entries(self, node)
            self._tables.extend(ring_word_entries(self, node))
        self._dict_depth += 1

    def leave_Dict(self, original_node: cst.Dict) -> None:
        self._dict_depth -= 1

    def leave_Module(self, original_node: cst.Module) -> None:
        # a table's gate entry that an allocation reads is reported (and fixed) there
        for value, message, fix in self._tables:
            if id(value) not in self._judged:
                self.report(value, message, fix=fix)

    def visit_Call(self, node: cst.Call) -> None:
        report_narrow_gate_fields(self, node)
        report_zipped_entries(self, node, Kind.EXPLICIT)

    def _gate_dtype(self, target: cst.CSTNode | None, value: cst.BaseExpression | None) -> None:
        report_setting(self, target, value)

    def check_binding(self, binding: GateCacheBinding) -> None:
        for fact in self.facts(binding):
            if fact.kind is not Kind.EXPLICIT:
                continue
            if chosen_by_gate_setting(self.provenance, fact.dtypes):
                continue  # `Cache(decay_dtype=str2dtype(opt.decay_dtype))`: that setting's
            dtypes = literal_names(fact.non_float32_literals)
            origin = binding_lines(self.context, fact.dtypes) + through(self.context, fact)
            fix = self.fix_for(binding, fact, fact.target, "Allocate it as {float32}")
            self._judged.update(id(d.node) for d in fact.dtypes)
            self.report(
                reported_at(fact, self.context.gate_caches),
                f"{self.subject(binding)} is allocated as {dtypes}{origin}; {WHY}{self.withheld(binding, fact)}",
                fix=fix,
            )
