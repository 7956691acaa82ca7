"""RL001: a gate cache allocated with an explicit dtype other than float32."""

from __future__ import annotations

from replaylint.lint.analysis import (
    GateCacheBinding,
    GateCacheRule,
    as_allocation,
    dtype_sources,
    literal_dtype,
)
from replaylint.lint.context import FixDraft, Replace
from replaylint.lint.dtypes import FLOAT32
from replaylint.lint.findings import Applicability
from replaylint.lint.rule import Invalid, Valid
from replaylint.lint.rules._messages import gate_cache_subject


class ExplicitNonFp32Dtype(GateCacheRule):
    CODE = "RL001"
    NAME = "explicit-non-fp32-dtype"
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
"""
    FIX = """\
Replaces the dtype with `torch.float32`, spelled with the module's own alias for torch (`th.float32`
after `import torch as th`; `import torch` is added when the module has no binding for it). The fix
is **safe**: it changes only the gate cache's dtype, which the kernel requires to be float32; every
reader of the cache either expects float32 or casts.
"""
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
    )

    def check_binding(self, binding: GateCacheBinding) -> None:
        for source in dtype_sources(self.context, binding.value):
            allocation = as_allocation(self.context, source)
            if allocation is None or allocation.dtype_arg is None:
                continue
            dtype_expr = allocation.dtype_arg.value
            dtype = literal_dtype(self.context, dtype_expr)
            if dtype is None or dtype == FLOAT32:
                continue
            spelling, extra_edits = self.context.torch_attribute("float32")
            self.report(
                dtype_expr,
                f"{gate_cache_subject(self.context, binding)} is allocated as torch.{dtype}; "
                "gate caches hold log-decays that are summed and exponentiated, so they must "
                "be float32",
                fix=FixDraft(
                    f"Allocate it as {spelling}",
                    (Replace(dtype_expr, spelling), *extra_edits),
                    Applicability.SAFE,
                ),
            )
