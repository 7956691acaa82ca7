"""The fix for a module cast: protect the module's gate caches, then cast as before.

``model.half()`` becomes ``replaylint.guards.keep_fp32_gate_caches(model).half()``: every other
buffer and parameter is cast as before, and the gate caches keep float32. Unsafe: the module then
imports replaylint at run time, and the instance's class becomes a protected subclass of the same
name (which also keeps the gate caches float32 through later casts and state-dict loads).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from replaylint.lint.dataflow.modules import GUARD, guard_knows
from replaylint.lint.fixes.drafts import AddModuleImport, FixDraft, Replace
from replaylint.lint.model import Applicability
from replaylint.lint.syntax.nodes import dotted_name

_FORMATTED = re.compile(r"\{[^{}]*\}")


def protect_before_cast(
    module: cst.Module, cast: cst.Call, buffer_name: str, others: Sequence[str] = ()
) -> FixDraft | None:
    """The fix for ``cast`` (``<receiver>.half()``, ``.to(dtype)``) of a module whose gate cache
    ``buffer_name`` (and perhaps ``others``) it would convert; None when the receiver is
    ``super()``."""
    func = cast.func
    if not isinstance(func, cst.Attribute):
        return None
    receiver = func.value
    if isinstance(receiver, cst.Call) and dotted_name(receiver.func) == "super":
        return None
    # at run time the guard knows the default patterns only: a name they miss is passed to it
    patterns = dict.fromkeys(_FORMATTED.sub("*", name) for name in (buffer_name, *others))
    unknown = [pattern for pattern in patterns if not guard_knows(pattern)]
    extra = f", extend_gate_cache_names={unknown!r}" if unknown else ""
    code = module.code_for_node(receiver)
    return FixDraft(
        f"Keep its gate caches float32 through the cast with `replaylint.guards.{GUARD}`",
        (
            Replace(receiver, f"replaylint.guards.{GUARD}({code}{extra})"),
            AddModuleImport("replaylint.guards"),
        ),
        Applicability.UNSAFE,
    )
