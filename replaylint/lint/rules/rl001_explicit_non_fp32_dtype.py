"""RL001: a gate cache allocated with an explicit dtype other than float32."""

from __future__ import annotations

from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import FIX_SAFETY, WHY, binding_lines, literal_names, through


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

Recognised allocations: `torch.empty/zeros/ones/full/rand/randn/empty_strided/tensor/as_tensor`,
their `*_like` forms and `x.new_empty/new_zeros/new_ones/new_full/new_tensor`, through any import
alias (`import torch as th`, `from torch import zeros`), also when wrapped in `nn.Parameter(...)`
or followed by dtype-preserving calls such as `.to(device)` or `.contiguous()`. Every dtype
spelling is understood: `torch.half` is float16, `torch.double` float64, `torch.float` float32.
The dtype is followed through local bindings in the function: `ring_dtype = torch.bfloat16` and
then `dtype=ring_dtype` is an explicit bf16 allocation, reported here (a non-literal dtype is
RL002's, so an allocation never gets both codes); a conditional with a bf16 branch is reported.
"""
    FIX = (
        """\
Replaces the dtype with `torch.float32`, spelled with the module's own alias for torch (`th.float32`
after `import torch as th`; `import torch` is added when the module has no binding for it). The fix
is **safe**: it changes only the gate cache's dtype, which the kernel requires to be float32; every
reader of the cache either expects float32 or casts.
"""
        + FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        Valid(
            """
            import torch
            g_cache = torch.zeros(slots, hv, ring, k, dtype=torch.float32, device=device)
            """
        ),
        Valid(
            """
            import torch
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
    )
    INVALID = (
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
    )

    def check_binding(self, binding: GateCacheBinding) -> None:
        for fact in self.facts(binding):
            if fact.kind is not Kind.EXPLICIT or fact.target is None:
                continue
            dtypes = literal_names(fact.non_float32_literals)
            origin = binding_lines(self.context, fact.dtypes) + through(self.context, fact)
            self.report(
                fact.node,
                f"{self.subject(binding)} is allocated as {dtypes}{origin}; {WHY}{self.withheld(binding, fact)}",
                fix=self.fix_for(
                    binding, fact, fact.target, "Allocate it as {float32}", Applicability.SAFE
                ),
            )
