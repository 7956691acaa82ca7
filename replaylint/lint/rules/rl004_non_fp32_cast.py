"""RL004: a gate cache cast to a dtype other than float32."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.facts import Kind, TensorFact, TypeAsDeviceOfOther
from replaylint.lint.fixes.conditional import per_buffer_fix
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.buffer_loop_examples import BUFFER_LOOP_INVALID
from replaylint.lint.rules.buffer_loops import MADE_WITH_DTYPE, buffer_name_variable
from replaylint.lint.rules.container_casts import container_cast_message
from replaylint.lint.rules.gate_reads import READ_INVALID, READ_VALID, report_cast_read
from replaylint.lint.rules.module_cast_examples import MODULE_CAST_INVALID, MODULE_CAST_VALID
from replaylint.lint.rules.module_casts import ModuleCasts
from replaylint.lint.rules.wording import (
    FIX_SAFETY,
    WHY,
    literal_names,
    through,
)
from replaylint.lint.syntax.nodes import keyword_arg, method_name, positional_args
from replaylint.lint.syntax.sites import Site

_MODULE_CAST_METHODS = frozenset({"to", "half", "bfloat16", "type"})


class NonFp32Cast(Rule):
    SUMMARY = "A gate cache is cast to a dtype that is not provably float32."
    RATIONALE = """\
The ReplaySSM gate ring holds log-decays `g`; the kernel rebuilds the state as
`S0 * exp(G_T) + sum_j d_j (x) (exp(G_T - G_j) * k_j)` from their prefix sums `G`. In bfloat16 an
absolute error of one ulp in `G` is a relative error of up to ~0.4% in `exp(G)`, per stored step;
over a ring of 16 steps the decays are off by ~1.5%, and the checkpoint written at each flush
carries the error forward. The ring must stay float32.

Casts are how a correct float32 ring turns bf16 later: moving the state pool "to the model dtype"
(`.to(dtype=model_dtype)`, `.to(torch.bfloat16)`, `.bfloat16()`, `.half()`, `.type(...)`),
or matching another tensor (`.to(d_cache)`, `.type_as(k_cache)`, which take that tensor's dtype).
`.to(device)`, `.to("cuda", non_blocking=True)`, `.float()` and `.to(torch.float32)` are fine, and
so is `.to(other)` when `other` is known to be float32 (another gate cache).

A cast is found wherever its result becomes a gate cache: returned from a `@property g_cache`
or by a function, alone or in a tuple (`return d_cache.half(), g_cache.half()`),
passed as `Pool(g_cache=x.half())` or `state._replace(g_cache=...)`, in a dict or list literal or
a comprehension, assigned to `self.g_cache.data`, or made by `.to(**kw)` with a `dtype` in `kw`.
`.view(torch.bfloat16)` (or `.view(dtype)` of a name that holds a dtype: a parameter annotated
`torch.dtype`, one named `dtype`) is a reinterpretation of the buffer's bits, reported as well.
A cast of an operand that arithmetic then combines with other tensors into the gate value
(`A = A_log.exp().to(x.dtype)`; `g = -A * F.softplus(a + dt_bias)`) is reported once, at the
arithmetic, where the gate value takes the dtype of its operands; its fix casts every operand to
float32 instead.

A module cast converts buffers: `Pool(...).to(torch.bfloat16)`, `pool.half()`,
`model.type(torch.float16)` or `model.to(device, dtype)` on an `nn.Module` of the module that
registers a float32 gate buffer (`self.register_buffer("g_cache", ...)`,
`self.register_buffer(f"layer{i}_g_cache", ...)` or `self.g_cache = nn.Buffer(...)`, in the class
or a base class) casts that buffer with every other one. The cast recurses into submodules, so the
usual form is a cast of the whole model: `KimiModel(config).to(torch.bfloat16)` converts the gate
buffer of every `KimiDeltaAttention` that the model holds, as an attribute set in any method, in
an `nn.ModuleList`, `nn.ModuleDict`, `nn.Sequential`, list or comprehension, through
`add_module`/`setattr`, a layer-class table (`ATTENTION_CLASSES[kind](config)`) or a base class,
at any depth. The model may be built directly, by `cls(...)` in a classmethod
(`KimiModel.from_pretrained(...)`), by a factory function or method of the module, or come in as
an annotated parameter (`model: KimiModel`), `self` or `self.model`. A part that a setup method
installs after construction (`for block in self.layers: block.attention.kv_cache = Cache(...)` in
`setup_caches`) counts once that method has been called on an instance made in the casting
scope, and always for one handed in (a parameter, an attribute), whose setup may have run. A module of no known
class counts too when the module or the project has gate-buffer classes: `model: nn.Module` cast
by a precision wrapper, the result of a builder annotated `-> nn.Module` that is given no module,
or `self` cast in a mixin or base class of a gate-buffer class; so does a model of any class that
the casting function hands a gate-buffer submodule (`draft.replay_cache = ReplayCache(...)`),
and an element of a list of gate-buffer modules, held directly or returned by a property
(`for cache in self.kv_cache`). A copy (`copy.deepcopy(pool)`) is an instance of its original's
class, and a loop that casts every buffer (`for name, buf in model.named_buffers(): buf.data =
buf.data.to(dtype)`, `buf = buf.to(dtype)` or `out[name] = buf.detach().cpu().type_as(x)` on its
way elsewhere, also under an `if buf.is_floating_point():`, or a comprehension of such casts;
`module._buffers.items()` too, and a tensor made in another dtype that takes each buffer's place,
`host = torch.empty(buf.shape, dtype=host_dtype)`, `module._buffers[name] = host`) is
the module cast written out (a submodule of a module of no known class, `for owner in
model.modules()`, is one of no known class too; a loop that skips buffers by name, `if name in
keep: continue`, casts the gate buffer only where that test lets it through), and so is `model.load_state_dict(sd, assign=True)` of a state dict
whose every value was cast (`{k: v.to(dtype) for k, v in sd.items()}`: `assign=True` makes the
cast tensors the module's own; without it they are copied into the float32 buffers). A loop is
reported at its cast and a load at the call, without a fix (the guard would go before them). A loop over `parameters()` leaves the
buffers alone. Such a loop casts each tensor on its own, past a class's `_apply`: it is reported
for a class that keeps its gate buffers float32 through module casts too.

A helper of another module of the project that casts a module it is handed
(`def convert_module(self, module): return module.to(dtype=self.dtype)`, or one that hands it on
to such a method: `fabric.setup_module(model)`) is a module cast of what its callers pass: a call
of a function or method of that name, from a module that imports the helper's module, is reported
when the argument it passes is a model of a known class that holds a gate buffer. `.to(tensor)`
on a module casts to that tensor's dtype (`pool.to(next(model.parameters()))`). The cast
is reported where it is made, naming the path to the buffer. It is not reported when a class on the path keeps its gate
buffers float32: guarded (`@keep_fp32_gate_caches` or the `KeepFp32GateCaches` mixin from
`replaylint.guards`), or overriding `_apply`, `to`, `half`, `bfloat16` or `type` with a body that
puts them back to float32; nor when the cast's result goes straight into a function that puts
them back (`FastModel.for_inference(model.half())` setting `module.g_cache =
module.g_cache.float()`), into such a method of the module's classes called on it
(`model.half().restore_fp32_buffers_()`), or when the scope puts them back after the cast
(`for layer in model.layers: layer.g_cache = layer.g_cache.float()`); nor when the instance is guarded (`keep_fp32_gate_caches(model)`), the
cast is to float32 or float64 (which loses nothing; the kernel refuses float64 with an error), or
the gate buffer is registered in another dtype already (reported where it is registered).
"""
    FIX = (
        """\
Makes the cast float32 and keeps everything else: `.half()`/`.bfloat16()`/`.double()` become
`.float()`, a dtype argument (`.to(torch.bfloat16)`, `.to(device, dtype=model_dtype)`,
`.type(torch.half)`) becomes `torch.float32`. A cast to a dtype that is surely not float32 gave
a new tensor, so one of a tensor that something else may hold (a name, an attribute, an item)
stays a copy: `g.half()` and `g.to(torch.bfloat16)` become `g.to(torch.float32, copy=True)` (a
float32 source would otherwise be handed back as it is, and a write to the result would reach
the original; in a module that cannot spell torch without an import, `g.half()` becomes
`g.float().clone()`). A cast to a variable dtype (`g.to(model_dtype)`) may have handed a float32 ring
back as it is, so its fix passes no `copy`; `.type("torch.cuda.HalfTensor")` becomes
`.type("torch.cuda.FloatTensor")`, and `.to(other)` becomes `.to(other.device, torch.float32)` (the
same device move, float32 dtype). The fix is **safe**: the cast's result is the gate cache, and
only its dtype changes, to the one the kernel requires; the device, `non_blocking`, `copy` and the
dtype variable itself are untouched for every other use. `.type_as(other)` becomes
`.to(other.device, torch.float32)` (**unsafe**: `type_as` goes through the legacy tensor-type
name, which carries the device type but not its index, so with several GPUs the two may place the
result differently). `.to(**kw)` whose mapping carries a dtype becomes `.to(**{**kw, "dtype": torch.float32})`. `.view(torch.bfloat16)`
is reported without a fix: it reinterprets the bits of the buffer it aliases, so the values would
change, not only their precision; allocate the gate cache as float32 instead. A module cast keeps
its cast (the other buffers and the parameters must follow the model dtype) and protects the
gate caches first: `model.half()` becomes `replaylint.guards.keep_fp32_gate_caches(model).half()`
(with `import replaylint.guards`; a buffer whose name the default patterns miss is named with
`extend_gate_cache_names=[...]`). That fix is **unsafe**: the module then imports replaylint (and
torch) at run time, and the instance's class becomes a protected subclass of the same name, which
also keeps its gate caches float32 through later casts and state-dict loads. Decorating the class
with `@keep_fp32_gate_caches` does the same for every instance. A call of a helper that casts the
module it is handed protects the argument the same way. A loop over `named_buffers()` that casts
every buffer keeps its cast for the others and makes the gate buffers float32
(`buf.to(torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else dtype)`, or
`buf.float() if ... else buf.half()`); also **unsafe**, as it tests the buffer's name.
"""
        + FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        *READ_VALID,
        Valid(
            """
            import torch

            def to_device(self, device):
                # a device move keeps float32
                self.g_cache = self.g_cache.to(device, non_blocking=True)
                self.d_cache = self.d_cache.to(device=device, dtype=self.dtype)
            """
        ),
        Valid(
            """
            import torch

            def restore(snapshot, device):
                g_cache = snapshot.to(device=device, dtype=torch.float32)
                replayssm_g = snapshot.float()
                return g_cache, replayssm_g
            """
        ),
        Valid(
            """
            import torch

            def adopt(self, other_pool):
                # another gate cache is float32: matching it keeps float32
                self.g_cache = self.g_cache.to(other_pool.g_cache)
            """
        ),
        Valid(
            """
            import torch
            # the d and k rings follow the model dtype
            d_cache = d_cache.to(torch.bfloat16)
            k_cache = k_cache.half()
            """
        ),
        Valid(
            """
            import torch

            class Pool:
                @property
                def g_cache(self):
                    # the property casts to float32; reshaping views keep it
                    return self._g_ring.float().view(self.slots, -1)

                def step(self, delta):
                    # in place: the gate cache keeps its float32 dtype
                    self.g_cache += delta.half()
            """
        ),
        Valid(
            """
            import torch

            def move(g_cache, device):
                moved = {"device": device, "dtype": torch.float32}
                return {"g_cache": g_cache.to(**moved), "d_cache": g_cache.view(torch.float32)}
            """
        ),
        *MODULE_CAST_VALID,
    )
    INVALID = (
        *READ_INVALID,
        Invalid(
            """
            import torch

            def to_model_dtype(self, model_dtype):
                self.g_cache = self.g_cache.to(dtype=model_dtype)
            """,
            expected_fix="""
            import torch

            def to_model_dtype(self, model_dtype):
                self.g_cache = self.g_cache.to(dtype=torch.float32)
            """,
            message_contains="`.to(model_dtype)`",
        ),
        Invalid(
            """
            import torch as th
            replayssm_g = replayssm_g.to("cuda", th.bfloat16, non_blocking=True)
            """,
            expected_fix="""
            import torch as th
            replayssm_g = replayssm_g.to("cuda", th.float32, non_blocking=True, copy=True)
            """,
            message_contains="torch.bfloat16",
        ),
        Invalid(
            """
            def halve(pool):
                pool.g_cache = pool.g_cache.half().contiguous()
            """,
            expected_fix="""
            def halve(pool):
                pool.g_cache = pool.g_cache.float().clone().contiguous()
            """,
        ),
        Invalid(
            """
            import torch

            def match_rings(d_cache: torch.Tensor, g_cache: torch.Tensor):
                return {"g_cache": g_cache.to(d_cache, non_blocking=True)}
            """,
            expected_fix="""
            import torch

            def match_rings(d_cache: torch.Tensor, g_cache: torch.Tensor):
                return {"g_cache": g_cache.to(d_cache.device, torch.float32, non_blocking=True)}
            """,
            message_contains="`.to(d_cache)`",
        ),
        Invalid(
            """
            def legacy(layer_cache):
                layer_cache.replayssm_g = layer_cache.replayssm_g.type("torch.cuda.HalfTensor")
            """,
            expected_fix="""
            def legacy(layer_cache):
                layer_cache.replayssm_g = layer_cache.replayssm_g.type("torch.cuda.FloatTensor")
            """,
        ),
        Invalid(
            """
            import torch

            class Pool:
                @property
                def g_cache(self):
                    return self._g_ring.to(torch.bfloat16)
            """,
            expected_fix="""
            import torch

            class Pool:
                @property
                def g_cache(self):
                    return self._g_ring.to(torch.float32, copy=True)
            """,
        ),
        Invalid(
            """
            import torch

            def to_model(pool, model_dtype):
                kw = {"device": "cuda", "dtype": model_dtype}
                pool.d_cache = pool.d_cache.to(**kw)
                pool.g_cache.data = pool.g_cache.data.to(**kw)
            """,
            expected_fix="""
            import torch

            def to_model(pool, model_dtype):
                kw = {"device": "cuda", "dtype": model_dtype}
                pool.d_cache = pool.d_cache.to(**kw)
                pool.g_cache.data = pool.g_cache.data.to(**{**kw, "dtype": torch.float32})
            """,
            message_contains="`.to(**kw)`",
        ),
        Invalid(
            """
            import torch

            def to_half(cache):
                # the caller gets the gate cache back in float16
                state, d_cache, k_cache, g_cache = cache
                return state, d_cache.half(), k_cache.half(), g_cache.half()
            """,
            """
            import torch

            def to_half(cache):
                # the caller gets the gate cache back in float16
                state, d_cache, k_cache, g_cache = cache
                return state, d_cache.half(), k_cache.half(), g_cache.to(torch.float32, copy=True)
            """,
            message_contains="`.half()`",
        ),
        Invalid(
            """
            import torch

            def as_wire_format(pool):
                # reinterprets the float32 bits: reported, no fix
                pool.g_cache = pool.raw_ring.view(torch.bfloat16)
            """,
            message_contains="reinterprets",
        ),
        Invalid(
            """
            import torch

            def unpack(packed: torch.Tensor, d_bytes: int, dtype: torch.dtype):
                # the packed bytes read back in the model dtype: reported, no fix
                d_cache = packed[:, :d_bytes].view(dtype)
                g_cache = packed[:, d_bytes:].contiguous().view(dtype)
                return d_cache, g_cache
            """,
            message_contains="`.view(dtype)`, which reinterprets",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            def draft_step(attn, hidden):
                # weights cast to the activation dtype: the product is computed in it
                A = attn.A_log.exp().to(hidden.dtype)
                dt_bias = attn.dt_bias.to(hidden.dtype)
                g = -A[:, None] * F.softplus(attn.f_proj(hidden) + dt_bias)
                attn.g_cache = g
            """,
            expected_fix="""
            import torch
            import torch.nn.functional as F

            def draft_step(attn, hidden):
                # weights cast to the activation dtype: the product is computed in it
                A = attn.A_log.exp().to(torch.float32)
                dt_bias = attn.dt_bias.to(torch.float32)
                g = -A[:, None] * F.softplus(attn.f_proj(hidden) + dt_bias)
                attn.g_cache = g
            """,
            message_contains="is computed by arithmetic that gives it the dtype of its operands",
        ),
        *MODULE_CAST_INVALID,
        *BUFFER_LOOP_INVALID,
    )

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._module_casts: ModuleCasts | None = None
        self._combined: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        report_cast_read(self, node)
        container = container_cast_message(self.context, self.provenance, node, self.site())
        if container is not None:  # `state.to(device, dtype=self.dtype)` of a ring record
            self.report(node, container)
            return
        method = method_name(node)
        if self._module_casts is None:
            self._module_casts = ModuleCasts(self.context, self.provenance)
        if method not in _MODULE_CAST_METHODS and method != "load_state_dict":
            helped = self._module_casts.helper_finding(node, self.site())
            if helped is not None:  # `fabric.setup_module(model)`
                self.report(node, helped.message, fix=helped.fix)
            return
        if method == "load_state_dict":
            taken = self._module_casts.assigned_state_finding(node, self.site())
            if taken is not None:
                self.report(taken[0], taken[1])
            return
        found = self._module_casts.finding(node, self.site())
        if found is not None:
            self.report(node, found.message, fix=found.fix)

    def visit_For(self, node: cst.For) -> None:
        self._buffer_loop(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._buffer_loop(node)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._buffer_loop(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._buffer_loop(node)

    def _buffer_loop(self, node: cst.For | cst.DictComp | cst.ListComp | cst.GeneratorExp) -> None:
        if self._module_casts is None:
            self._module_casts = ModuleCasts(self.context, self.provenance)
        site = self.site()
        found = self._module_casts.buffer_loop_finding(node, site)
        if found is None:
            return
        cast, message, buffers = found
        key = buffer_name_variable(node)
        fix = None
        if key is not None and buffers and not any("{" in name for name in buffers):
            names = ", ".join(f'"{name}"' for name in buffers)
            condition = f'{key}.rsplit(".", 1)[-1] in ({names}{"," if len(buffers) == 1 else ""})'
            torch = self.context.spelling.torch_at(site)
            fix = per_buffer_fix(
                self.context.module, torch, cast, self._dtype_argument(cast, site), condition
            )
        self.report(cast, message, fix=fix)

    def _dtype_argument(self, cast: cst.Call, site: Site) -> cst.BaseExpression | None:
        """The dtype argument of ``x.to(..., dtype)``, ``x.to(dtype=...)`` or of a tensor made
        in each buffer's place, ``torch.empty(buf.shape, dtype=...)``; None otherwise."""
        keyword = keyword_arg(cast, "dtype")
        if method_name(cast) in MADE_WITH_DTYPE:
            return None if keyword is None else keyword.value
        if method_name(cast) != "to":
            return None
        if keyword is not None:
            return keyword.value
        for arg in positional_args(cast)[:2]:
            if to_argument_role(self.provenance, arg.value, site) == "dtype":
                return arg.value
        return None

    def check_binding(self, binding: GateCacheBinding) -> None:
        combined: dict[
            int, tuple[cst.BaseExpression, list[tuple[TensorFact, FixDraft | None]]]
        ] = {}
        for fact in self.facts(binding):
            if fact.kind is not Kind.CAST:
                continue
            literals = fact.non_float32_literals
            target = literal_names(literals) if literals else "a dtype that is not provably float32"
            # `.view(dtype)` reinterprets the bits of a buffer it aliases: a cast is no fix
            reinterpreted = fact.call is not None and method_name(fact.call) == "view"
            message = (
                "Cast to {float32} on the other tensor's device instead"
                if isinstance(fact.target, TypeAsDeviceOfOther)
                else "Cast to {float32} instead"
            )
            fix = (
                None
                if reinterpreted
                else self.fix_for(binding, fact, fact.target, message, Applicability.SAFE)
            )
            arithmetic = _combined_at(fact)
            if arithmetic is not None:  # `g = -A * softplus(a)` of a cast `A`
                combined.setdefault(id(arithmetic), (arithmetic, []))[1].append((fact, fix))
                continue
            self.report(
                fact.node,
                f"{self.subject(binding)} is cast to {target} by {fact.detail}"
                f"{through(self.context, fact)}; {WHY}{self.withheld(binding, fact)}",
                fix=fix,
            )
        for key, (arithmetic, casts) in combined.items():
            if key not in self._combined:
                self._combined.add(key)
                self._report_combined(binding, arithmetic, casts)

    def _report_combined(
        self,
        binding: GateCacheBinding,
        node: cst.BaseExpression,
        casts: list[tuple[TensorFact, FixDraft | None]],
    ) -> None:
        """One finding at ``node``, where arithmetic combines cast operands into the gate
        value, with the fix of every cast (float32 operands give a float32 result)."""
        first = casts[0][0]
        literals = sorted({d for fact, _ in casts for d in fact.non_float32_literals})
        target = (
            literal_names(tuple(literals)) if literals else "a dtype that is not provably float32"
        )
        shown = " and ".join(dict.fromkeys(f"{fact.detail}" for fact, _ in casts))
        fixes = [fix for _, fix in casts]
        fix = None
        if all(f is not None for f in fixes):
            edits = tuple(edit for f in fixes if f is not None for edit in f.edits)
            unsafe = any(f is not None and f.applicability is Applicability.UNSAFE for f in fixes)
            fix = FixDraft(
                "Cast the operands to float32 instead",
                edits,
                Applicability.UNSAFE if unsafe else Applicability.SAFE,
            )
        self.report(
            node,
            f"{self.subject(binding)} is computed by arithmetic that gives it the dtype of its "
            f"operands, cast to {target} by {shown}{through(self.context, first)}; {WHY}",
            fix=fix,
        )


def _combined_at(fact: TensorFact) -> cst.BaseExpression | None:
    """The arithmetic nearest the cast, on the way to the gate cache, that combines the cast
    tensor with other tensors (``g = -A[:, None] * F.softplus(a + dt_bias)``): where the gate
    value takes its dtype. None when the cast value reaches the gate cache as it is (or scaled by
    a number)."""
    for binding in reversed(fact.via):
        value = binding.value
        if isinstance(value, cst.BinaryOperation) and not (
            _number(value.left) or _number(value.right)
        ):
            return value
    return None


def _number(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.UnaryOperation):
        return _number(expr.expression)
    return isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary))
