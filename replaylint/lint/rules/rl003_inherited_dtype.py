"""RL003: a gate cache whose dtype is inherited (torch's default, another tensor's) not chosen."""

from __future__ import annotations

from replaylint.lint.dataflow.facts import CastValue, Kind
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
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

When the code sets the default itself — `torch.set_default_dtype(...)` earlier in the function or
at module level, or a context manager around the allocation that sets it (vLLM's
`set_default_torch_dtype(dtype)`, or a `@contextmanager` of the module that calls
`torch.set_default_dtype`) — the finding names that line and the dtype it sets.

The allocation is also found behind `functools.partial(torch.zeros, device=...)` allocators,
lambdas, helpers the module calls and `field(default_factory=...)`; a call's own `dtype=` wins
over a partial's. In a run over a project, helpers, partials and lambdas imported from another
module of the project are followed as well, and the finding names the file and line of the
helper.

Not reported: a copy or `*_like` of a tensor known to be float32 (another gate cache, a local
allocated as float32), and `x.clone()` of a tensor cast with `.float()`.
"""
    FIX = (
        """\
Adds `dtype=torch.float32` to the allocation (spelled with the module's alias for torch; `import
torch` is added when missing); for `x.clone()` it appends `.to(torch.float32)`. The fix is
**safe**: it removes nothing — every argument stays — and it only pins the gate cache's dtype to
the one the kernel requires. When the inherited dtype was float32 already, nothing changes at run
time.
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
            factory_kwargs = {"device": device}
            g_cache = torch.empty(
                shape,
                **factory_kwargs,
            )
            """,
            expected_fix="""
            import torch
            factory_kwargs = {"device": device}
            g_cache = torch.empty(
                shape,
                **factory_kwargs, dtype=torch.float32,
            )
            """,
        ),
        Invalid(
            """
            import functools
            import torch

            on_device = functools.partial(torch.empty, device="cuda")
            d_cache = on_device(4, 16)
            g_cache = on_device(4, 16)
            """,
            expected_fix="""
            import functools
            import torch

            on_device = functools.partial(torch.empty, device="cuda")
            d_cache = on_device(4, 16)
            g_cache = on_device(4, 16, dtype=torch.float32)
            """,
            message_contains="torch's default dtype",
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
    )

    def check_binding(self, binding: GateCacheBinding) -> None:
        for fact in self.facts(binding):
            if fact.kind is not Kind.INHERITED:
                continue
            subject = self.subject(binding)
            if isinstance(fact.target, CastValue):
                message = f"{subject} is {fact.detail}, which is not known to be float32"
                action = "Cast the copy with .to({float32})"
            else:
                message = f"{subject} is allocated without a dtype, so it takes {fact.detail}"
                action = "Allocate it with dtype={float32}"
            fix = self.fix_for(binding, fact, fact.target, action, Applicability.SAFE)
            self.report(
                fact.node,
                f"{message}{through(self.context, fact)}; {WHY}{self.withheld(binding, fact)}",
                fix=fix,
            )
