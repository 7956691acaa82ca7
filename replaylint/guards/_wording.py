"""How each guard words its errors and warnings.

Every message names the function, the argument, the dtype it got and the dtype it needs, and
ends with what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaylint.guards._errors import (
    DtypeGuardError,
    DtypeGuardWarning,
    GateCacheDtypeError,
    GateCacheDtypeWarning,
)

__all__ = ["GATE_CACHE", "GENERIC", "WarningKey", "Wording", "dtypes_text", "render_warning"]

WarningKey = tuple[str, str, str, str, str, torch.dtype, tuple[torch.dtype, ...]]
"""(decoration serial, kind "cast"/"warn"/"load", wording name, function, argument, got, wanted).

Only strings and dtypes, so that torch.compile can hand it to a compile-time callback as a
constant (with ``dynamic=True`` an int could be traced as a symbolic value).
"""


@dataclass(frozen=True)
class Wording:
    """The vocabulary of one guard family."""

    name: str
    error: type[DtypeGuardError]
    warning: type[DtypeGuardWarning]
    subject: str
    """How the sentence "but ... must be float32" names the argument."""
    why: str | None
    """One clause: why the dtype is required (None when the guard cannot know)."""
    fix: str
    """What to do, with ``{param}`` and ``{want}`` placeholders."""

    def reject(
        self, func: str, param: str, got: torch.dtype, allowed: tuple[torch.dtype, ...]
    ) -> str:
        want = dtypes_text(allowed)
        because = f": {self.why}" if self.why else ""
        return (
            f"{func}(): argument {param!r} is {got}, but {self.subject} must be {want}{because}. "
            f"Fix: {self._fix(param, allowed)}. To cast it at run time instead, decorate with "
            f"policy='cast' or set REPLAYLINT_GUARD=cast."
        )

    def not_tensor(
        self, func: str, param: str, value: object, allowed: tuple[torch.dtype, ...]
    ) -> str:
        kind = type(value)
        got = "None" if value is None else f"{kind.__module__}.{kind.__qualname__}"
        message = (
            f"{func}(): argument {param!r} must be a torch.Tensor of dtype "
            f"{dtypes_text(allowed)}; got {got}."
        )
        if value is None:
            return (
                message + f" {param!r} may be None only when its default is None; pass the tensor."
            )
        if kind.__module__ == "numpy":
            return message + " Convert NumPy arrays with torch.from_numpy(...) and the right dtype."
        return message + " Pass the tensor itself."

    def cast_refused(
        self, func: str, param: str, got: torch.dtype, want: torch.dtype, reason: str
    ) -> str:
        return (
            f"{func}(): argument {param!r} is {got} and policy 'cast' cannot convert it to {want}: "
            f"{reason}. Fix: {self._fix(param, (want,))}."
        )

    def cast_warning(self, func: str, param: str, got: torch.dtype, want: torch.dtype) -> str:
        if _loses_precision(got, want):
            cost = f"the caller's storage stays {got}, so precision is lost on every call"
            if self.why:
                cost += f" ({self.why})"
        elif _loses_precision(want, got):
            cost = (
                f"the function computes with the values rounded to {want}, and every call pays "
                "a full copy in and a comparison to find what to copy back"
            )
        else:
            cost = "every call pays a full copy in and a comparison to find what to copy back"
        return (
            f"{func}(): argument {param!r} is {got}; policy 'cast' runs the call on a {want} copy "
            f"and copies the elements it changes back into the caller's tensor, but {cost}. "
            f"Fix: {self._fix(param, (want,))}. (Shown once per function and dtype.)"
        )

    def pass_through_warning(
        self, func: str, param: str, got: torch.dtype, allowed: tuple[torch.dtype, ...]
    ) -> str:
        because = f": {self.why}" if self.why else ""
        return (
            f"{func}(): argument {param!r} is {got}, but {self.subject} should be "
            f"{dtypes_text(allowed)}{because}. Policy 'warn' passes it through unchanged. "
            f"Fix: {self._fix(param, allowed)}. (Shown once per function and dtype.)"
        )

    def loaded_warning(self, func: str, param: str, got: torch.dtype, want: torch.dtype) -> str:
        if _loses_precision(want, got):
            what = (
                f"The copy rounds each value to {want} precision, the precision {self.subject} "
                f"is kept in; the {got} digits beyond it are not used"
            )
        else:
            what = (
                f"The values were already rounded to {got} when they were stored, and the copy "
                "cannot restore that"
            )
        return (
            f"{func}(): {param} is {got}; returning a {want} copy. {what}. "
            f"Fix: {self._fix(param, (want,))}. (Shown once per dtype.)"
        )

    def late_result(
        self, func: str, param: str, got: torch.dtype, want: torch.dtype, late: str
    ) -> str:
        return (
            f"{func}(): argument {param!r} is {got}, and policy 'cast' ran the call on a {want} "
            f"copy, but the function returned {late}: its code runs after the call has returned, "
            "when the copy is no longer copied back, so its writes would be lost. A coroutine or "
            "generator is closed unstarted; writes made before it was returned were copied back. "
            f"Fix: {self._fix(param, (want,))}, or guard the function that does the work."
        )

    def _fix(self, param: str, allowed: tuple[torch.dtype, ...]) -> str:
        return self.fix.format(param=param, want=allowed[0])


def dtypes_text(allowed: tuple[torch.dtype, ...]) -> str:
    if len(allowed) == 1:
        return str(allowed[0])
    return "one of " + ", ".join(str(dtype) for dtype in allowed)


def _loses_precision(got: torch.dtype, want: torch.dtype) -> bool:
    if not (got.is_floating_point and want.is_floating_point):
        return got.itemsize < want.itemsize
    return torch.finfo(got).eps > torch.finfo(want).eps


GENERIC = Wording(
    name="generic",
    error=DtypeGuardError,
    warning=DtypeGuardWarning,
    subject="it",
    why=None,
    fix="create {param} with dtype={want} where it is allocated, or convert it with "
    ".to({want}) before the call",
)

GATE_CACHE = Wording(
    name="gate_cache",
    error=GateCacheDtypeError,
    warning=GateCacheDtypeWarning,
    subject="the ReplaySSM gate cache",
    why="its per-step log-decays are summed and exponentiated, so rounding them becomes "
    "decay error that compounds across flushes",
    fix="allocate {param} as {want} (e.g. torch.zeros(..., dtype={want})); "
    "`replaylint --fix` finds and rewrites the allocation",
)

_WORDINGS: dict[str, Wording] = {wording.name: wording for wording in (GENERIC, GATE_CACHE)}


def render_warning(key: WarningKey) -> tuple[str, type[DtypeGuardWarning]]:
    """The text and category of the warning that ``key`` identifies."""
    _serial, kind, wording_name, func, param, got, wanted = key
    wording = _WORDINGS[wording_name]
    if kind == "cast":
        text = wording.cast_warning(func, param, got, wanted[0])
    elif kind == "warn":
        text = wording.pass_through_warning(func, param, got, wanted)
    else:
        text = wording.loaded_warning(func, param, got, wanted[0])
    return text, wording.warning
