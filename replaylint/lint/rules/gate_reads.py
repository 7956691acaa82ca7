"""RL004 on reads of the gate ring cast for a computation: ``gates = cache.g_cache[slot,
:, :cursor].to(cache.state.dtype)`` then ``gates.cumsum(dim=1)``.

The ring keeps its log-decays float32 so that their prefix sums and the decays exponentiated from
them are exact; a read cast to the state's or the model's dtype before the sums throws that away
for the rows read, whatever dtype the ring itself has. A cast whose result becomes a gate cache,
is handed to a decode entry point, or goes into a mapping or a file is judged where it is bound
(the other rules' findings); this module reports the rest: casts to a dtype that is not provably
float32 of an expression that reads a gate cache (its name, an element or slice of it, a
``.detach()``/``.clone()`` of it). The fix casts to float32 instead, unsafe: what the computation
does next may need the narrower dtype (an ``einsum`` with a bf16 operand).
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.nodes import binding_name, method_name, one_line
from replaylint.lint.syntax.traversal import syntax_children

__all__ = ["READ_INVALID", "READ_VALID", "report_cast_read"]

_CASTS = frozenset({"to", "half", "bfloat16", "type", "type_as"})
# calls that keep a read of the ring what it is (a view, a copy on the same dtype)
_KEEPING = frozenset({"detach", "clone", "contiguous", "view", "reshape", "flatten", "squeeze"})


def report_cast_read(rule: Rule, call: cst.Call) -> None:
    """Report ``call`` when it casts a read of a gate cache to a dtype that is not provably
    float32 for a computation."""
    if method_name(call) not in _CASTS or not isinstance(call.func, cst.Attribute):
        return
    read = _gate_read(rule, call.func.value)
    site = rule.site()
    if read is None or site.statement is None:
        return
    if _judged_elsewhere(rule, call, _path(site.statement, call)):
        return
    facts = rule.provenance.tensor_facts(call, site)
    if not facts or any(f.kind is not Kind.CAST for f in facts):
        return  # float32 on some path, or not a cast the analysis reads
    literals = sorted({d for fact in facts for d in fact.non_float32_literals})
    target = literal_names(literals) if literals else "a dtype that is not provably float32"
    made = rule.context.spelling.edits_for(facts[0].target, site) if facts[0].target else None
    fix = made and FixDraft(f"Cast to {rule.float32(site)} instead", made[0], Applicability.UNSAFE)
    rule.report(
        call,
        f"gate cache `{one_line(rule.context.module, read)}` is read and cast to {target} "
        f"by `{_shown(rule, call)}` for a computation, which loses the precision the ring "
        f"keeps; {WHY}",
        fix=fix,
    )


def _shown(rule: Rule, call: cst.Call) -> str:
    """``.to(cache.state.dtype)``: the cast as written after its receiver."""
    module = rule.context.module
    arguments = ", ".join(module.code_for_node(arg).strip().rstrip(",") for arg in call.args)
    return f".{method_name(call)}({arguments})"


def _path(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes from ``root`` down to ``target``'s parent, outermost first."""
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode]]] = [(root, [])]
    while stack:
        node, above = stack.pop()
        if node is target:
            return above
        stack.extend((child, [*above, node]) for child in syntax_children(node))
    return []


def _gate_read(rule: Rule, expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """The gate cache ``expr`` reads (itself, an element or slice of it, a view of it)."""
    names = rule.context.gate_caches
    for _ in range(8):
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and method_name(expr) in _KEEPING:
            assert isinstance(expr.func, cst.Attribute)
            expr = expr.func.value
        else:
            break
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    name = binding_name(expr)
    if name is None or not names.matches(name) or names.is_plural(name):
        return None
    if rule.provenance.is_mapping(name, rule.site(), one_line(rule.context.module, expr)):
        return None
    return expr


def _judged_elsewhere(rule: Rule, call: cst.Call, parents: list[cst.CSTNode]) -> bool:
    """Whether the cast's result is bound, passed or stored where another check judges it, or a
    finding covers it already: only a result that a computation uses at once (a method called
    on it, an operand) or that a local not named for a gate cache takes is reported here."""
    within = rule.provenance.within
    if any(within(d.node, call) or within(call, d.node) for d in rule.context.drafts):
        return True
    parent = parents[-1] if parents else None
    if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
        targets = (
            [t.target for t in parent.targets]
            if isinstance(parent, cst.Assign)
            else [parent.target]
        )
        # a local of the computation; not a store into an object or a tensor (`ring[i] = ...`
        # copies into the ring, in its dtype), nor a gate cache's own binding
        return not all(isinstance(t, cst.Name) for t in targets) or any(
            _names_a_gate_cache(rule, t) for t in targets
        )
    return not isinstance(
        parent, (cst.Attribute, cst.BinaryOperation, cst.UnaryOperation, cst.Comparison)
    )


def _names_a_gate_cache(rule: Rule, target: cst.BaseExpression) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_names_a_gate_cache(rule, e.value) for e in target.elements)
    name = binding_name(target)
    return name is not None and rule.context.gate_caches.matches(name)


READ_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        def materialize_state(cache, slot, cursor, x):
            # the ring's rows summed in float32; moved, not cast
            prefix = cache.g_cache[slot, :, :cursor].float().cumsum(dim=1)
            rows = cache.g_cache[slot].to(x.device)
            return prefix.exp(), rows
        """
    ),
)
READ_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        def materialize_state(cache, slot, cursor):
            gates = cache.g_cache[slot, :, :cursor].to(cache.state.dtype)
            prefix = gates.cumsum(dim=1).float()
            return (prefix[:, -1:] - prefix).exp()
        """,
        expected_fix="""
        import torch

        def materialize_state(cache, slot, cursor):
            gates = cache.g_cache[slot, :, :cursor].to(torch.float32)
            prefix = gates.cumsum(dim=1).float()
            return (prefix[:, -1:] - prefix).exp()
        """,
        message_contains="`cache.g_cache` is read and cast to a dtype that is not provably "
        "float32 by `.to(cache.state.dtype)`",
    ),
)
