"""RL003: a gate cache whose dtype is inherited (torch's default, another tensor's) not chosen."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import AddDtypeArgument, CastValue, Kind, TensorFact
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.computed_examples import COMPUTED_INVALID, COMPUTED_VALID
from replaylint.lint.rules.split_gate_returns import (
    SPLIT_INVALID,
    SPLIT_VALID,
    SplitReturn,
    split_return,
)
from replaylint.lint.rules.wording import FIX_SAFETY, WHY, through


class InheritedDtype(Rule):
    SUMMARY = (
        "A gate cache is allocated without a dtype, so it inherits torch's default dtype or "
        "another tensor's."
    )
    RATIONALE = """\
ReplaySSM decode rebuilds the recurrent state from a checkpoint and the gate ring: the kernel sums
the stored per-step log-decays and exponentiates the sums, so rounding in `g` becomes a relative
error in every decay, and it is folded into the checkpoint at each flush. The gate ring must be
float32; a bf16 ring is off by ~1.5% per decay at ring length 16 and the error compounds.

An allocation without `dtype=` does not mean float32. `torch.zeros(shape)` follows torch's
*default* dtype, and model loaders (`from_pretrained(torch_dtype=...)`, `set_default_dtype`,
`torch.device("meta")` init helpers) set that to the model dtype while they build modules — exactly
when state pools are allocated. `torch.zeros_like(d_cache)`, `d_cache.new_zeros(...)` and
`x.clone()` take the dtype of the tensor they start from, which for d and k rings is the model
dtype. The code looks correct in a float32 unit test and is bf16 in production.

Reported where the default may be another dtype than float32: in a class's code (a module's
`__init__`, a dataclass field's `default_factory`: loaders construct them under the model dtype),
under a setting of the default that is not provably float32, and in a function of the module that
such code calls. Elsewhere — a plain function or module-level code that nothing runs under
another default — the allocation takes torch's own default, float32, and is not reported.

When the code sets the default itself — `torch.set_default_dtype(...)` earlier in the function or
at module level, or a context manager around the allocation that sets it (vLLM's
`set_default_torch_dtype(dtype)`, or a `@contextmanager` of the module that calls
`torch.set_default_dtype`) — the finding names that line and the dtype it sets.

The allocation is also found behind `functools.partial(torch.zeros, device=...)` allocators,
lambdas, helpers the module calls and `field(default_factory=...)`; a call's own `dtype=` wins
over a partial's. In a run over a project, helpers, partials and lambdas imported from another
module of the project are followed as well, and the finding names the file and line of the
helper.

A gate cache computed from a parameter (`torch.cat([tail, pad])`, `g.cumsum(-1) / temperature`)
keeps the dtype callers pass. When every call of the function in the module passes a tensor of one
dtype other than float32 (a cast, a helper's result, an element of a tuple a helper returns), the
finding names it; numbers (`float(...)`, `t.item()`, a parameter annotated `float`) do not
promote it, a float32 operand does. A call from another module is not seen.

A gate cache computed from activations (a layer's output, a `forward` argument, an argument the
module's calls fill with activations) and weights made in the model's dtype (`self.A_log =
nn.Parameter(torch.empty(hv, dtype=dtype))`) by elementwise steps, numbers and 0-dim tensors
(`bound * self.f_proj(x).sigmoid()`, `-self.A_log.exp() * F.softplus(a)`) has the model's dtype;
it is reported where it is computed, also in a method whose result becomes the gate cache. A
weight made float32 promotes the result, unless a module cast converts it, which is assumed only
where the class itself casts that weight to float32 elsewhere (`self.A_log.float()` in one branch,
not the other). A matrix product (`x @ self.w_a`) has its operands' dtype (torch requires one).
Log-decays computed that way and written into a float32 ring (`g_cache[slot, :, t] = x`,
`g_cache[slot].copy_(x)`, `index_copy_`) are reported too, without a fix: the copy keeps the ring
float32, not the digits the model's dtype lost; the cast belongs on the computation's inputs.
So is a gate function (`log_decay`, `_gate`, `compute_forget`: a name with `gate`, `decay` or
`forget` in it) that returns float32 log-decays on one path and ones computed from activations on
another (`return self.lower_bound * logits.sigmoid()` beside `return -self.A_log.float().exp() *
F.softplus(logits.float())`): its callers were written for float32, and one path hands them the
model's dtype. A parameter that defaults to a number, or to None with a name that says it bounds
or scales (`lower_bound=None`), is a number in these formulas.

Not reported: a copy or `*_like` of a float32 tensor, and `x.clone()` of one cast with `.float()`.
"""
    FIX = (
        """\
Adds `dtype=torch.float32` to the allocation (spelled with the module's alias for torch; `import
torch` is added when missing); for `x.clone()` it appends `.to(torch.float32)`. The fix is
**safe**: it removes nothing — every argument stays — and it only pins the gate cache's dtype to
the one the kernel requires. When the inherited dtype was float32 already, nothing changes at run
time.

For a gate cache computed from activations or from what callers pass, the fix casts the value
where it becomes the gate cache (other uses of the value keep theirs). It is **unsafe**: the cast
copies, so a view of the caller's tensor stops sharing its storage.
"""
        + FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        Valid(
            """
            import torch
            # explicit float32; d and k may inherit the model dtype
            d_cache = torch.zeros(slots, hv, ring, v)
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32)
            """
        ),
        Valid(
            """
            import torch

            def grow(self, extra):
                # like another gate cache: float32
                more = torch.zeros_like(self.g_cache[:extra])
                self.g_cache = torch.cat([self.g_cache, more])
                self.replayssm_g = torch.empty_like(self.g_cache)
            """
        ),
        Valid(
            """
            import torch

            def fork(pool):
                # cloning a gate cache, or a tensor known to be float32
                staged = torch.zeros(pool.shape, dtype=torch.float32)
                g_cache = staged.clone()
                spare_g_cache = pool.g_cache.clone()
                return g_cache, spare_g_cache
            """
        ),
        Valid(
            """
            import torch
            factory_kwargs = {"device": device, "dtype": torch.float32}
            g_cache = torch.empty(shape, **factory_kwargs)
            """
        ),
        Valid(
            """
            import torch

            def restore(snapshot):
                # cast explicitly before the copy: float32
                g_cache = snapshot.float().clone()
                return g_cache
            """
        ),
        Valid(
            """
            import functools
            import torch

            # the partial's dtype is float32 for every call that does not pass its own
            zeros = functools.partial(torch.zeros, device="cuda", dtype=torch.float32)
            g_cache = zeros(4, 16)
            """
        ),
        Valid(
            """
            import torch

            def clear_slot(g_cache, d_cache, slot):
                # written into the float32 ring: the copy casts it
                g_cache[slot] = d_cache[slot].new_zeros(g_cache.shape[1:])
            """
        ),
        Valid(
            """
            import torch
            from vllm.model_executor.model_loader.utils import set_default_torch_dtype

            def load(model_class, config, shape):
                with set_default_torch_dtype(config.dtype):
                    model = model_class(config)
                # after the loader's context: torch's own default, float32
                g_cache = -torch.rand(shape)
                return model, g_cache
            """
        ),
        *COMPUTED_VALID,
        *SPLIT_VALID,
    )

    INVALID = (
        Invalid(
            """
            import torch

            class KDAState:
                def __init__(self, slots, hv, ring, k, device):
                    self.g_cache = torch.zeros(slots, hv, ring, k, device=device)
            """,
            expected_fix="""
            import torch

            class KDAState:
                def __init__(self, slots, hv, ring, k, device):
                    self.g_cache = torch.zeros(slots, hv, ring, k, device=device, dtype=torch.float32)
            """,
            message_contains="torch's default dtype",
        ),
        Invalid(
            """
            import torch as th

            def make_rings(d_cache, k_cache):
                g_cache = th.zeros_like(d_cache)
                return d_cache, k_cache, g_cache
            """,
            expected_fix="""
            import torch as th

            def make_rings(d_cache, k_cache):
                g_cache = th.zeros_like(d_cache, dtype=th.float32)
                return d_cache, k_cache, g_cache
            """,
            message_contains="the dtype of `d_cache`",
        ),
        Invalid(
            """
            def snapshot(pool, slot):
                return {"g_cache": pool.d_cache[:, slot].new_empty(pool.g_shape)}
            """,
            expected_fix="""
            import torch
            def snapshot(pool, slot):
                return {"g_cache": pool.d_cache[:, slot].new_empty(pool.g_shape, dtype=torch.float32)}
            """,
        ),
        Invalid(
            """
            import torch

            def restore(self, saved_gates):
                self.replayssm_g = saved_gates.clone()
            """,
            expected_fix="""
            import torch

            def restore(self, saved_gates):
                self.replayssm_g = saved_gates.clone().to(torch.float32)
            """,
            message_contains="a clone of `saved_gates`",
        ),
        Invalid(
            """
            import torch

            class Pool(torch.nn.Module):
                def __init__(self, shape, device):
                    super().__init__()
                    factory_kwargs = {"device": device}
                    self.g_cache = torch.empty(
                        shape,
                        **factory_kwargs,
                    )
            """,
            expected_fix="""
            import torch

            class Pool(torch.nn.Module):
                def __init__(self, shape, device):
                    super().__init__()
                    factory_kwargs = {"device": device}
                    self.g_cache = torch.empty(
                        shape,
                        **factory_kwargs, dtype=torch.float32,
                    )
            """,
        ),
        Invalid(
            """
            import functools
            import torch
            from vllm.model_executor.model_loader.utils import set_default_torch_dtype

            on_device = functools.partial(torch.empty, device="cuda")

            with set_default_torch_dtype(torch.bfloat16):
                d_cache = on_device(4, 16)
                g_cache = on_device(4, 16)
            """,
            expected_fix="""
            import functools
            import torch
            from vllm.model_executor.model_loader.utils import set_default_torch_dtype

            on_device = functools.partial(torch.empty, device="cuda")

            with set_default_torch_dtype(torch.bfloat16):
                d_cache = on_device(4, 16)
                g_cache = on_device(4, 16, dtype=torch.float32)
            """,
            message_contains="torch's default dtype",
        ),
        Invalid(
            """
            import torch

            class LayerCaches:
                def __init__(self, layers, shape):
                    self.d_cache = [torch.zeros(shape) for _ in range(layers)]
                    self.g_cache = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]

                def reset(self, layer):
                    # `g_cache` is a list of rings: the element is replaced, not written into
                    self.g_cache[layer] = self.d_cache[layer].new_zeros(self.g_cache[layer].shape)
                    self.d_cache[layer].zero_()
            """,
            expected_fix="""
            import torch

            class LayerCaches:
                def __init__(self, layers, shape):
                    self.d_cache = [torch.zeros(shape) for _ in range(layers)]
                    self.g_cache = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]

                def reset(self, layer):
                    # `g_cache` is a list of rings: the element is replaced, not written into
                    self.g_cache[layer] = self.d_cache[layer].new_zeros(self.g_cache[layer].shape, dtype=torch.float32)
                    self.d_cache[layer].zero_()
            """,
            message_contains="the dtype of `self.d_cache[layer]`",
        ),
        Invalid(
            """
            import torch

            def seed_ring(g, ring_len):
                tail = g[:, -ring_len:].transpose(1, 2)
                g_cache = torch.cat([tail, tail.new_zeros(tail.shape)], dim=2)
                return g_cache

            def spec_prefix(draft_g, ring, temperature: float):
                offset = float(ring.sum())
                spec_g_cache = draft_g.cumsum(dim=1) / temperature + offset
                return spec_g_cache

            def prefill(x, ring):
                gates = -torch.rand(x.shape).to(torch.bfloat16)
                return seed_ring(gates, 4), spec_prefix(gates, ring, 0.7)
            """,
            expected_fix="""
            import torch

            def seed_ring(g, ring_len):
                tail = g[:, -ring_len:].transpose(1, 2)
                g_cache = torch.cat([tail, tail.new_zeros(tail.shape)], dim=2).to(torch.float32)
                return g_cache

            def spec_prefix(draft_g, ring, temperature: float):
                offset = float(ring.sum())
                spec_g_cache = (draft_g.cumsum(dim=1) / temperature + offset).to(torch.float32)
                return spec_g_cache

            def prefill(x, ring):
                gates = -torch.rand(x.shape).to(torch.bfloat16)
                return seed_ring(gates, 4), spec_prefix(gates, ring, 0.7)
            """,
            message_contains="which the calls of `seed_ring` in this module pass as torch.bfloat16",
        ),
        Invalid(
            """
            import torch

            def empty_ring(like, shape):
                g_cache = like.new_zeros(shape)
                return g_cache

            def reset(x):
                return empty_ring(x.to(torch.bfloat16), (4, 16))
            """,
            expected_fix="""
            import torch

            def empty_ring(like, shape):
                g_cache = like.new_zeros(shape, dtype=torch.float32)
                return g_cache

            def reset(x):
                return empty_ring(x.to(torch.bfloat16), (4, 16))
            """,
            message_contains="takes the dtype of `like`, which the calls of `empty_ring`",
        ),
        Invalid(
            """
            from dataclasses import dataclass, field
            import torch

            @dataclass
            class DecodeState:
                replayssm_g: torch.Tensor = field(default_factory=lambda: torch.zeros(4, 16))
            """,
            expected_fix="""
            from dataclasses import dataclass, field
            import torch

            @dataclass
            class DecodeState:
                replayssm_g: torch.Tensor = field(default_factory=lambda: torch.zeros(4, 16, dtype=torch.float32))
            """,
        ),
        Invalid(
            """
            import contextlib
            import torch

            @contextlib.contextmanager
            def model_dtype(dtype):
                previous = torch.get_default_dtype()
                torch.set_default_dtype(dtype)
                try:
                    yield
                finally:
                    torch.set_default_dtype(previous)

            def build(shape):
                with model_dtype(torch.bfloat16):
                    g_cache = torch.zeros(shape)
                return g_cache
            """,
            expected_fix="""
            import contextlib
            import torch

            @contextlib.contextmanager
            def model_dtype(dtype):
                previous = torch.get_default_dtype()
                torch.set_default_dtype(dtype)
                try:
                    yield
                finally:
                    torch.set_default_dtype(previous)

            def build(shape):
                with model_dtype(torch.bfloat16):
                    g_cache = torch.zeros(shape, dtype=torch.float32)
                return g_cache
            """,
            message_contains="`with model_dtype(torch.bfloat16)` sets to torch.bfloat16",
        ),
        Invalid(
            """
            import torch

            def load(config, shape):
                torch.set_default_dtype(config.torch_dtype)
                replayssm_g = torch.empty(shape)
                return replayssm_g
            """,
            expected_fix="""
            import torch

            def load(config, shape):
                torch.set_default_dtype(config.torch_dtype)
                replayssm_g = torch.empty(shape, dtype=torch.float32)
                return replayssm_g
            """,
            message_contains="`torch.set_default_dtype(config.torch_dtype)` sets to a dtype",
        ),
        *COMPUTED_INVALID,
        *SPLIT_INVALID,
    )

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._split: list[SplitReturn] = []

    def visit_Return(self, node: cst.Return) -> None:
        if (found := split_return(self, node)) is not None:
            self._split.append(found)

    def leave_Module(self, original_node: cst.Module) -> None:
        for found in self._split:
            if not self.covered(found.node):
                self.report(found.node, found.message)

    def check_binding(self, binding: GateCacheBinding) -> None:
        facts = self.facts(binding)
        passed = [fact for fact in facts if fact.kind is Kind.PASSED]
        if passed:
            self._passed(binding, passed)
        computed = [fact for fact in facts if fact.kind is Kind.ACTIVATION]
        if computed:  # one finding where it is first computed (`g = g.clamp_min(b)` follows it)
            self._activation(binding, min(computed, key=lambda f: self.context.line_of(f.node)))
        for fact in facts:
            if fact.kind is not Kind.INHERITED:
                continue
            subject = self.subject(binding)
            if isinstance(fact.target, CastValue):
                made = "allocated in " if fact.detail.startswith("the dtype of") else ""
                message = f"{subject} is {made}{fact.detail}, which is not known to be float32"
                action = "Cast the copy with .to({float32})"
            else:
                message = f"{subject} is allocated without a dtype, so it takes {fact.detail}"
                action = "Allocate it with dtype={float32}"
            fix = self.fix_for(binding, fact, fact.target, action)
            self.report(
                fact.node,
                f"{message}{through(self.context, fact)}; {WHY}{self.withheld(binding, fact)}",
                fix=fix,
            )

    def check_write(self, binding: GateCacheBinding) -> None:
        """Log-decays computed in the model's dtype and copied into the ring: the copy keeps
        the ring float32 but not the digits lost before it. Reported without a fix: the cast
        belongs on the computation's inputs, which only the author can place."""
        if self.provenance.is_mapping(binding.name, binding.site, binding.display):
            return
        for fact in self.provenance.tensor_facts(binding.value, binding.site):
            if fact.kind is not Kind.ACTIVATION:
                continue
            message = (
                f"the values written into gate cache `{binding.display}` are computed from "
                f"{fact.detail}, by steps that keep the model's dtype (elementwise, numbers, "
                "weights, activations), not float32; the copy into the ring keeps the rounding"
            )
            self.report(fact.node, f"{message}{through(self.context, fact)}; {WHY}")
            return

    def _activation(self, binding: GateCacheBinding, fact: TensorFact) -> None:
        """Computed from activations: reported where it is computed, cast where it becomes the
        gate cache; not in a local whose name is only guessed (a forward's `log_decay`)."""
        origin = self.context.gate_caches.learned_from(binding.name)
        if origin is not None and origin.guessed and binding.display == binding.name:
            return
        message = f"{self.subject(binding)} is computed from {fact.detail}, by steps that keep "
        message += "the model's dtype (elementwise, numbers, weights, activations), not float32"
        self.report(
            fact.node, f"{message}{through(self.context, fact)}; {WHY}", fix=self._cast(binding)
        )

    def _cast(self, binding: GateCacheBinding) -> FixDraft | None:
        """A cast of the value where it becomes the gate cache (a copy: unsafe)."""
        spelling = self.context.spelling
        made = None if binding.shared_with else spelling.cast_at(binding.value, binding.site)
        if made is None:
            return None
        action = f"Cast it to {self.float32(binding.site)} where it becomes the gate cache"
        return FixDraft(action, made[0], Applicability.UNSAFE)

    def _passed(self, binding: GateCacheBinding, facts: list[TensorFact]) -> None:
        """One finding where the gate cache is made from what the module's calls pass."""
        details = " and ".join(dict.fromkeys(fact.detail for fact in facts))
        target = facts[0].target
        if isinstance(target, AddDtypeArgument) and target.node is binding.value:
            # `x.new_zeros(...)` of what callers pass: allocate it as float32
            message = f"allocated without a dtype, so it takes the dtype of {details}"
            fix = self.fix_for(binding, facts[0], target, "Allocate it with dtype={float32}")
            self.report(binding.value, f"{self.subject(binding)} is {message}; {WHY}", fix=fix)
            return
        self.report(
            binding.value,
            f"{self.subject(binding)} is computed from {details}, and keeps that dtype; {WHY}",
            fix=self._cast(binding),
        )
