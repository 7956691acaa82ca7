"""RL004's casts of a ring container by its own method: ``state.to(device, dtype=self.dtype)``
on an instance of a project record class whose ``to`` casts every floating tensor it holds
(:mod:`replaylint.lint.dataflow.record_casts`), the gate ring's field among them.

A record without a field named like a gate cache holds none. A file is read for these casts
only when the pre-filter lets it through (it names a gate cache, or casts a module holding
one); one that only calls ``state.to(dtype)`` is not.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.record_casts import record_cast
from replaylint.lint.rules.wording import WHY, describe_dtype
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.sites import Site

__all__ = ["container_cast_message"]


def container_cast_message(
    context: FileContext, prov: Provenance, call: cst.Call, site: Site
) -> str | None:
    """The finding's message for ``call`` when it casts a record's gate ring; None otherwise."""
    cast = record_cast(prov, call, site)
    if cast is None:
        return None
    gates = [name for name in cast.fields if context.gate_caches.matches(name)]
    if not gates:
        return None
    facts = cast.facts
    narrow = sorted({f.dtype for f in facts if f.dtype is not None and f.dtype != "float32"})
    dtype = (
        ", ".join(f"torch.{d}" for d in narrow)
        if narrow and all(f.dtype is not None for f in facts)
        else f"{describe_dtype(context, cast.dtype, facts)}, which is not provably float32"
    )
    held = ", ".join(f"`{name}`" for name in gates)
    return (
        f"`{one_line(context.module, call)}` casts every floating tensor of `{cast.record}` "
        f"({cast.where}) to {dtype}, its gate ring {held} included; {WHY}"
    )
