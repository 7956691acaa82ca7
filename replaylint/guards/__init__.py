"""Runtime dtype guards for ReplaySSM decode entry points (``pip install replaylint[guards]``).

The ReplaySSM gate cache holds per-step log-decays whose prefix sums are exponentiated, so it
must be float32 whatever the model dtype. Put :func:`fp32_gate_cache` on every decode entry point
that receives it::

    from replaylint.guards import fp32_gate_cache

    @fp32_gate_cache                     # the parameter is named g_cache
    def decode_step(q, k, v, d_cache, k_cache, g_cache, out): ...

On float32 the guard costs one ``isinstance`` and one dtype comparison per call. Policies for a
wrong dtype: ``"reject"`` (default, raises :class:`GateCacheDtypeError`), ``"cast"`` (runs on a
float32 copy and copies back the elements the call changed), ``"warn"`` and ``"off"``. The
environment variable ``REPLAYLINT_GUARD`` (read once, at import) and :func:`guard_policy`
override the decorators' policy. :func:`require_dtypes` is the general form for any parameter and dtype.

Whole modules: :func:`keep_fp32_gate_caches` (or the :class:`KeepFp32GateCaches` mixin) keeps a
module's gate caches float32 through ``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.type()``
and ``load_state_dict``; :func:`find_gate_caches` and :func:`assert_fp32_gate_caches` walk a
module, pool, dict, list or dataclass and report each gate cache with its path. Gate caches are
recognised by name, with the linter's patterns. See docs/guards.md for the exact behaviour of
each policy, torch.compile and CUDA graphs.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as _error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "replaylint.guards needs PyTorch; install it with `pip install 'replaylint[guards]'`."
    ) from _error

from replaylint.guards._errors import (
    DtypeGuardError,
    DtypeGuardWarning,
    GateCacheDtypeError,
    GateCacheDtypeWarning,
)
from replaylint.guards._gate_cache import as_fp32_gate_cache, fp32_gate_cache
from replaylint.guards._modules import KeepFp32GateCaches, keep_fp32_gate_caches
from replaylint.guards._policy import Policy, guard_policy
from replaylint.guards._require import require_dtypes
from replaylint.guards._walk import FoundGateCache, assert_fp32_gate_caches, find_gate_caches

__all__ = [
    "DtypeGuardError",
    "DtypeGuardWarning",
    "FoundGateCache",
    "GateCacheDtypeError",
    "GateCacheDtypeWarning",
    "KeepFp32GateCaches",
    "Policy",
    "as_fp32_gate_cache",
    "assert_fp32_gate_caches",
    "find_gate_caches",
    "fp32_gate_cache",
    "guard_policy",
    "keep_fp32_gate_caches",
    "require_dtypes",
]
