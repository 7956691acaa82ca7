"""RL006's per-key helpers: a call of a helper that allocates every entry of the mapping it is
given in one dtype, with a mapping whose keys name the gate cache.

The helper may serve callers whose mappings hold no gate cache, so it is not rewritten; where
the call passes the dtype, the unsafe fix spreads a second call of the helper that makes the gate
entry again in float32 (:mod:`replaylint.lint.fixes.keyed_split`).
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.keyed_allocations import keyed_allocation, known_keys
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.fixes.keyed_split import keyed_split_fix, split_for_gate
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.unlisted_keys import gate_keys_read
from replaylint.lint.rules.wording import WHY, named_gate_cache, quoted
from replaylint.lint.syntax.nodes import one_line, only_statement
from replaylint.lint.syntax.sites import Site


def keyed_helper_finding(
    context: FileContext, prov: Provenance, call: cst.Call, site: Site
) -> HelperFinding | None:
    """What to report for ``call``, when it is such a call."""
    read: list[str] = []
    if not any(_gate_keys(context, prov, arg.value, site) for arg in call.args if not arg.star):
        # first the cheap question, which almost every call answers no; then whether the
        # result is used as holding the gate cache (`rings = alloc(shapes, dtype)`, then
        # `rings["g_cache"]`), for a mapping whose keys cannot be listed
        read = _read_gate_keys(context, call, site)
        if not read:
            return None
    if split_for_gate(site.statement, call):
        return None  # `{**alloc(shapes, dtype), **alloc({"g_cache": ...}, torch.float32)}`
    found = keyed_allocation(prov, call, site)
    if found is None:
        return None
    gates = _gate_keys(context, prov, found.mapping, found.mapping_site) or read
    if not gates or (found.dtypes and all(f.is_float32 for f in found.dtypes)):
        return None
    module = context.module
    helper = one_line(module, call.func)
    where = (
        f"line {context.line_of(found.defined)}"
        if isinstance(found.defined, cst.FunctionDef)
        else found.defined
    )
    if found.passed is not None:
        dtype = f"the dtype this call passes, `{one_line(module, found.passed)}`"
    else:
        known = sorted({f.dtype for f in found.dtypes if f.dtype is not None})
        dtype = f"`torch.{'` or `torch.'.join(known)}`" if known else "the helper's own dtype"
    subject = named_gate_cache(context.gate_caches, gates[0])
    others = f" (and {', '.join(quoted(g) for g in gates[1:])})" if gates[1:] else ""
    return HelperFinding(
        call,
        f"{subject}{others} is allocated by `{helper}` ({where}), which gives every entry of "
        f"`{one_line(module, found.mapping)}` {dtype}, not provably float32; allocate the gate "
        f"cache on its own as float32 ({WHY})",
        None
        if found.passed is None
        else keyed_split_fix(
            module, context.spelling.torch_at(site), call, found.mapping, found.passed, gates
        ),
    )


def _gate_keys(
    context: FileContext, prov: Provenance, mapping: cst.BaseExpression, site: Site
) -> list[str]:
    if not isinstance(mapping, (cst.Dict, cst.DictComp, cst.Name, cst.Attribute, cst.Call)):
        return []
    return sorted(k for k in known_keys(prov, mapping, site) if context.gate_caches.matches(k))


def _read_gate_keys(context: FileContext, call: cst.Call, site: Site) -> list[str]:
    """The gate-cache keys the code reads the result of ``call`` under, for ``target = call``
    with a mapping argument whose keys are not known."""
    statement = only_statement(site.statement) if site.statement is not None else None
    if not (
        isinstance(statement, cst.Assign)
        and statement.value is call
        and len(statement.targets) == 1
        and isinstance(target := statement.targets[0].target, (cst.Name, cst.Attribute))
        and isinstance(call.func, (cst.Name, cst.Attribute))
        and len(call.args) >= 2
    ):
        return []
    return sorted(gate_keys_read(context, target, site))
