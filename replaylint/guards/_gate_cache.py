"""``fp32_gate_cache`` and ``as_fp32_gate_cache``: the ReplaySSM gate cache must be float32."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

import torch

from replaylint.guards._cast import narrowing_refusal
from replaylint.guards._errors import GateCacheDtypeError
from replaylint.guards._policy import Policy, parse_policy
from replaylint.guards._require import DtypeGuard
from replaylint.guards._warn_once import emit_once
from replaylint.guards._wording import GATE_CACHE

__all__ = ["as_fp32_gate_cache", "fp32_gate_cache"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_FLOAT32 = (torch.float32,)
_LOADER_SERIAL = "0"  # decorated functions count from 1


@overload
def fp32_gate_cache(fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...
@overload
def fp32_gate_cache(fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
@overload
def fp32_gate_cache(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def fp32_gate_cache(
    fn: None = None, /, *, policy: Policy = "reject", arg: str = "g_cache"
) -> DtypeGuard: ...
def fp32_gate_cache(fn: Any = None, /, *, policy: Policy = "reject", arg: str = "g_cache") -> Any:
    """Require the ReplaySSM gate cache argument to be a float32 tensor.

    Use it bare (``@fp32_gate_cache``) or configured
    (``@fp32_gate_cache(policy="cast", arg="gate_ring")``). ``arg`` names the guarded parameter;
    ``policy`` says what a wrong dtype does:

    * ``"reject"`` (default): raise :class:`GateCacheDtypeError`;
    * ``"cast"``: run on a float32 copy and copy back into the caller's tensor exactly the
      elements the call changed (a read-only call leaves it untouched), refusing values the copy
      cannot hold; warn once per function and dtype with :class:`GateCacheDtypeWarning`;
    * ``"warn"``: warn once, pass the tensor through unchanged;
    * ``"off"``: no check.

    ``REPLAYLINT_GUARD`` and :func:`guard_policy` override ``policy``.
    """
    if not isinstance(arg, str) or not arg.isidentifier():
        raise TypeError(
            f"fp32_gate_cache(arg=...) takes the name of the gate-cache parameter as a string; "
            f"got {arg!r}."
        )
    guard = DtypeGuard(
        {arg: _FLOAT32},
        parse_policy(policy, where="fp32_gate_cache(policy=...)"),
        GATE_CACHE,
        "fp32_gate_cache",
        missing_hint=" To guard a parameter with another name, use @fp32_gate_cache(arg='<name>').",
    )
    if fn is None:
        return guard
    return guard(fn)


def as_fp32_gate_cache(t: torch.Tensor, /) -> torch.Tensor:
    """Return ``t`` if it is float32, else a float32 copy (with a warning, once per dtype).

    For loaders of saved ring buffers. Only floating-point tensors are converted; anything else
    raises :class:`GateCacheDtypeError`, and so does a float64 tensor holding finite values
    beyond float32's range (checking that reads the tensor: one device synchronisation). The guard policy does not apply here: calling this
    function is already the decision to convert.
    """
    if isinstance(t, torch.Tensor) and t.dtype is torch.float32:
        return t
    if not isinstance(t, torch.Tensor):
        raise GateCacheDtypeError(GATE_CACHE.not_tensor("as_fp32_gate_cache", "t", t, _FLOAT32))
    if not t.dtype.is_floating_point:
        raise GateCacheDtypeError(
            GATE_CACHE.cast_refused(
                "as_fp32_gate_cache",
                "t",
                t.dtype,
                torch.float32,
                f"{t.dtype} is not a floating-point dtype, so it holds no gate values to convert",
            )
        )
    key = (
        _LOADER_SERIAL,
        "load",
        GATE_CACHE.name,
        "as_fp32_gate_cache",
        "the gate cache",
        t.dtype,
        _FLOAT32,
    )
    converted = t.to(torch.float32)
    reason = narrowing_refusal(t, converted)
    if reason is not None:
        raise GateCacheDtypeError(
            GATE_CACHE.cast_refused("as_fp32_gate_cache", "t", t.dtype, torch.float32, reason)
        )
    emit_once(key, stacklevel=2)
    return converted
