"""Exception and warning classes raised by the dtype guards.

Each reports ``__module__ == "replaylint.guards"``, where it is public, so that tracebacks,
warning filters (``-W error::replaylint.guards.GateCacheDtypeWarning``) and pickles name the
public path.
"""

from __future__ import annotations

__all__ = [
    "DtypeGuardError",
    "DtypeGuardWarning",
    "GateCacheDtypeError",
    "GateCacheDtypeWarning",
]


class DtypeGuardError(TypeError):
    """A guarded argument has the wrong dtype, is not a tensor, or cannot be cast.

    Raised by functions decorated with :func:`replaylint.guards.require_dtypes`. A ``TypeError``
    so that code which already handles bad argument types keeps working.
    """

    __module__ = "replaylint.guards"


class GateCacheDtypeError(DtypeGuardError):
    """The ReplaySSM gate cache is not float32 (raised by ``@fp32_gate_cache``)."""

    __module__ = "replaylint.guards"


class DtypeGuardWarning(UserWarning):
    """A guard passed or cast an argument of the wrong dtype (policies ``"warn"``/``"cast"``)."""

    __module__ = "replaylint.guards"


class GateCacheDtypeWarning(DtypeGuardWarning):
    """The ReplaySSM gate cache is not float32 and was cast or passed through unchanged."""

    __module__ = "replaylint.guards"
