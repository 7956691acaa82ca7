"""Guard policies and how the effective one is chosen for a call.

Precedence, highest first: an open :func:`guard_policy` block in the current thread (or asyncio
task), then the ``REPLAYLINT_GUARD`` environment variable (read once, when this module is
imported), then the ``policy=`` given to the decorator.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Literal

__all__ = ["ENV_VAR", "POLICIES", "Policy", "effective_policy", "guard_policy", "parse_policy"]

Policy = Literal["reject", "cast", "warn", "off"]
POLICIES: tuple[Policy, ...] = ("reject", "cast", "warn", "off")
ENV_VAR = "REPLAYLINT_GUARD"


def parse_policy(value: object, *, where: str) -> Policy:
    """Return ``value`` as a policy name, or raise an error that says what is accepted."""
    if isinstance(value, str):
        name = value.strip().lower()
        if name in POLICIES:
            return name
        raise ValueError(
            f"{where} must be one of 'reject', 'cast', 'warn' or 'off'; got {value!r}."
        )
    raise TypeError(
        f"{where} must be one of the strings 'reject', 'cast', 'warn' or 'off'; "
        f"got {type(value).__name__} {value!r}."
    )


def _policy_from_environment() -> Policy | None:
    raw = os.environ.get(ENV_VAR, "")
    if not raw.strip():
        return None
    return parse_policy(raw, where=f"The environment variable {ENV_VAR}")


_ENV_POLICY: Policy | None = _policy_from_environment()

_OVERRIDE: ContextVar[Policy | None] = ContextVar("replaylint_guard_policy", default=None)
# How many guard_policy() blocks are open in any thread. While it is zero the policy is decided
# from plain module globals, which torch.compile can trace (it cannot trace ContextVar.get).
_open_overrides = 0
_open_overrides_lock = threading.Lock()


def effective_policy(declared: Policy) -> Policy:
    """The policy in force for one call of a guard declared with ``declared``."""
    if _open_overrides:
        override = _OVERRIDE.get()
        if override is not None:
            return override
    if _ENV_POLICY is not None:
        return _ENV_POLICY
    return declared


def guard_policy(policy: Policy) -> AbstractContextManager[Policy]:
    """Override every guard's policy inside a ``with`` block, for this thread or task only.

    The override wins over ``REPLAYLINT_GUARD`` and over the decorators' ``policy=``. It is held
    in a :class:`contextvars.ContextVar`, so other threads keep their own policy; asyncio tasks
    created inside the block inherit it, as they inherit any context variable::

        with replaylint.guards.guard_policy("cast"):
            step(bf16_gate_cache)  # cast instead of rejected
    """
    return _override(parse_policy(policy, where="guard_policy(policy)"))


@contextmanager
def _override(policy: Policy) -> Iterator[Policy]:
    global _open_overrides
    with _open_overrides_lock:
        _open_overrides += 1
    token = _OVERRIDE.set(policy)
    try:
        yield policy
    finally:
        _OVERRIDE.reset(token)
        with _open_overrides_lock:
            _open_overrides -= 1
