"""RL006's mappings of unknown keys that the module reads under a gate-cache key.

``self.rings = {name: torch.zeros(shape, dtype=dtype) for name, shape in self.shapes.items()}``
gives every entry one dtype. When the keys come from something the analysis cannot list (record
fields of another module, a config), the module's own reads say what the mapping holds:
``self.rings["log_alpha"][idx]`` handed on as a ring means one of the entries is the gate cache.
The fix is the loop's conditional one (``torch.float32 if name == "log_alpha" else dtype``), which
leaves every other entry as it was.
"""

from __future__ import annotations

from typing import Protocol

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.allocations import literal_dtype
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.torch_api import FLOAT32
from replaylint.lint.fixes.conditional import conditional_fix
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.wording import WHY, made_how, named_gate_cache
from replaylint.lint.syntax.nodes import keyword_arg, one_line, string_key
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

# what a shared dtype makes of an entry that is reported (not float32, not an index)
_REPORTED = frozenset({Kind.EXPLICIT, Kind.VARIABLE, Kind.INHERITED, Kind.CAST})


class _Checking(Protocol):
    """The rule asking: its file, its analysis and where it is."""

    @property
    def context(self) -> FileContext: ...
    @property
    def provenance(self) -> Provenance: ...
    def site(self) -> Site: ...


def read_key_finding(
    rule: _Checking, target: cst.BaseExpression, table: cst.BaseExpression
) -> HelperFinding | None:
    """What to report for ``target = table`` when ``table`` is a dict comprehension whose keys
    cannot be listed and the module reads ``target`` under a gate-cache key."""
    if not isinstance(table, cst.DictComp):
        return None
    context, prov, site = rule.context, rule.provenance, rule.site()
    loop = table.for_in
    if loop.inner_for_in is not None or not isinstance(target, (cst.Name, cst.Attribute)):
        return None
    if not isinstance(table.value, cst.Call) or prov.iterations(loop.target, loop.iter, site):
        return None  # listed keys: judged entry by entry
    gate = _gate_key_read(context, target)
    if gate is None or _decided_for(prov, table.value, gate):
        return None
    facts = [f for f in prov.tensor_facts(table.value, site) if f.kind in _REPORTED]
    if not facts:
        return None
    fact = facts[0]
    key = table.key
    condition = (
        f'{key.value} == "{gate}"'
        if isinstance(key, cst.Name) and key.value in _loop_names(loop.target)
        else None
    )
    torch = context.spelling.torch_at(site)
    fix = None if condition is None else conditional_fix(context.module, torch, fact, condition)
    module = context.module
    subject = named_gate_cache(context.gate_caches, gate)
    return HelperFinding(
        fact.node,
        f'{subject} (read as `{one_line(module, target)}["{gate}"]`) is {made_how(fact)} by a '
        f"comprehension over `{one_line(module, loop.iter)}` that gives every entry one dtype; "
        f"{WHY}",
        fix,
    )


def _decided_for(prov: Provenance, call: cst.Call, gate: str) -> bool:
    """``dtype=torch.float32 if name == "g_cache" else dtype``: the gate entry's own dtype."""
    dtype = keyword_arg(call, "dtype")
    value = dtype.value if dtype is not None else None
    if not isinstance(value, cst.IfExp) or literal_dtype(prov.index, value.body) != FLOAT32:
        return False
    test = value.test
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, (cst.Equal, cst.In))
        and any(
            isinstance(node, cst.SimpleString) and node.evaluated_value == gate
            for node in descendants(test.comparisons[0].comparator)
        )
    )


def _gate_key_read(context: FileContext, target: cst.BaseExpression) -> str | None:
    """The gate-cache key the module reads ``target`` under (``self.rings["log_alpha"]``)."""
    module = context.module
    written = module.code_for_node(target)
    for node in descendants(module):
        if not isinstance(node, cst.Subscript):
            continue
        key = string_key(node)
        # the key first: spelling out every subscripted value costs more
        if (
            key is not None
            and context.gate_caches.matches(key)
            and module.code_for_node(node.value) == written
        ):
            return key
    return None


def _loop_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple):
        return {e.value.value for e in target.elements if isinstance(e.value, cst.Name)}
    return set()
