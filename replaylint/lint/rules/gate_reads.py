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
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.wording import WHY, literal_names
from replaylint.lint.syntax.nodes import binding_name, dotted_name, method_name, one_line
from replaylint.lint.syntax.traversal import ancestors

__all__ = ["READ_INVALID", "READ_VALID", "report_cast_read"]

_CASTS = frozenset({"to", "half", "bfloat16", "type", "type_as"})
# calls that write what they are given to a file (`torch.save`, `np.save`, `save_file`)
_SAVERS = frozenset({"save", "savez", "savez_compressed", "save_file"})
# calls that keep a read of the ring what it is (a view, a copy on the same dtype)
_KEEPING = frozenset({"detach", "clone", "contiguous", "view", "reshape", "flatten", "squeeze"})


def report_cast_read(rule: Rule, call: cst.Call) -> None:
    """Report ``call`` when it casts a read of a gate cache to a dtype that is not provably
    float32 for a computation."""
    if method_name(call) not in _CASTS or not isinstance(call.func, cst.Attribute):
        return
    site = rule.site()
    if site.statement is None:
        return
    parents = ancestors(site.statement, call)
    read = _gate_read(rule, call.func.value, parents)
    if read is None:
        return
    stored = _stored(parents, rule.context.gate_caches, _named(rule, read))
    if rule.covered(call) or (not stored and _judged_elsewhere(rule, call, parents)):
        return
    if stored and _to_destination_dtype(rule, call, parents):
        return  # `ring[i] = rows.to(ring.dtype)`: what the destination holds already
    facts = rule.provenance.tensor_facts(call, site)
    if not facts or any(f.kind is not Kind.CAST for f in facts):
        return  # float32 on some path, or not a cast the analysis reads
    literals = sorted({d for fact in facts for d in fact.non_float32_literals})
    target = literal_names(literals) if literals else "a dtype that is not provably float32"
    made = rule.context.spelling.edits_for(facts[0].target, site) if facts[0].target else None
    fix = made and FixDraft(f"Cast to {rule.float32(site)} instead", made[0], Applicability.UNSAFE)
    purpose = "and stored (a copy" if stored else "for a computation (which"
    rule.report(
        call,
        f"gate cache `{one_line(rule.context.module, read)}` is read and cast to {target} "
        f"by `{_shown(rule, call)}` {purpose} loses the precision the ring keeps); {WHY}",
        fix=fix,
    )


def _shown(rule: Rule, call: cst.Call) -> str:
    """``.to(cache.state.dtype)``: the cast as written after its receiver."""
    module = rule.context.module
    arguments = ", ".join(module.code_for_node(arg).strip().rstrip(",") for arg in call.args)
    return f".{method_name(call)}({arguments})"


def _named(rule: Rule, read: cst.BaseExpression) -> bool:
    name = binding_name(read)
    return name is not None and rule.context.gate_caches.matches(name)


def _stored(parents: list[cst.CSTNode], names: GateCacheNames, named: bool) -> bool:
    """Whether the cast's result is kept as a copy of the ring's rows: appended to a list
    (``out.append(g[idx].half())``), saved (``torch.save(g.half(), path)``), written into a
    tensor (``dst.copy_(g.bfloat16())``, ``dst[slot] = g[slot].half()``), or a value of a
    list or dict literal that is (a payload, a snapshot) or that a function returns, with no
    computation on the way. A literal's own key naming a gate cache is judged as that binding
    instead."""
    contained = False
    for parent in reversed(parents):
        if isinstance(parent, (cst.Element, cst.List, cst.Tuple, cst.DictElement, cst.Dict)):
            key = parent.key if isinstance(parent, cst.DictElement) else None
            if isinstance(key, cst.SimpleString) and names.matches(str(key.evaluated_value)):
                return False  # `{"g_cache": ...}`: a gate cache of its own, checked there
            contained = True
            continue
        if isinstance(parent, (cst.ListComp, cst.GeneratorExp)):
            contained = True
            continue
        if isinstance(parent, cst.Arg):
            continue
        if isinstance(parent, cst.Call):  # appended, written to a file or into a tensor
            called = (dotted_name(parent.func) or "").rpartition(".")[2]
            return method_name(parent) in {"append", "copy_"} or called in _SAVERS
        if isinstance(parent, cst.Assign):
            # `ring[slot] = other.g_cache[slot].half()`: the rounded rows written into a tensor
            return not contained and all(
                isinstance(t.target, cst.Subscript) for t in parent.targets
            )
        # `return [g[idx].half() for g in self.g_cache]`: copies handed out (a gate-cache name
        # returned cast is judged with the function's returns)
        return contained and isinstance(parent, cst.Return) and not named
    return False


def _to_destination_dtype(rule: Rule, call: cst.Call, parents: list[cst.CSTNode]) -> bool:
    """Whether ``call`` casts to the dtype of the tensor it is written into: ``dst[i] =
    src[i].to(dst.dtype)``, ``dst.copy_(src.type_as(dst))``; the write would convert to that
    dtype anyway."""
    destination: cst.BaseExpression | None = None
    for parent in reversed(parents):
        if isinstance(parent, cst.Call) and method_name(parent) == "copy_":
            assert isinstance(parent.func, cst.Attribute)
            destination = parent.func.value
            break
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            destination = parent.targets[0].target
            break
    while isinstance(destination, cst.Subscript):
        destination = destination.value
    if destination is None or not call.args:
        return False
    module = rule.context.module
    written = module.code_for_node(destination).strip()
    argument = call.args[0].value
    if method_name(call) == "type_as":
        return module.code_for_node(argument).strip() == written
    return (
        isinstance(argument, cst.Attribute)
        and argument.attr.value == "dtype"
        and module.code_for_node(argument.value).strip() == written
    )


def _loop_source(name: str, parents: list[cst.CSTNode], rule: Rule) -> cst.BaseExpression | None:
    """What the loop variable ``name`` iterates over, element by element: ``self.g_cache`` of
    ``for g in self.g_cache``, of ``for d, g in zip(self.d_cache, self.g_cache)``, of
    ``enumerate(self.g_cache)``, in a comprehension or a ``for`` statement."""
    loops: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
    for parent in reversed(parents):
        if isinstance(parent, (cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)):
            loops.append((parent.for_in.target, parent.for_in.iter))
    found = rule.provenance.lookup(name, rule.site())
    if found and len(found) == 1 and found[0][0].kind == "loop":
        statement = found[0][0].statement
        if isinstance(statement, cst.For):
            loops.append((statement.target, statement.iter))
    for target, iterable in loops:
        source = _element_source(target, iterable, name)
        if source is not None:
            return source
    return None


def _element_source(
    target: cst.BaseExpression, iterable: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    if isinstance(target, cst.Name):
        return iterable if target.value == name else None
    if not isinstance(target, cst.Tuple) or not isinstance(iterable, cst.Call):
        return None
    func, args = iterable.func, [a.value for a in iterable.args if not a.keyword and not a.star]
    elements = [e.value for e in target.elements]
    if isinstance(func, cst.Name) and func.value == "zip" and len(args) == len(elements):
        pairs = list(zip(elements, args, strict=True))
    elif isinstance(func, cst.Name) and func.value == "enumerate" and len(elements) == 2 and args:
        pairs = [(elements[1], args[0])]
    else:
        return None
    for element, source in pairs:
        if isinstance(element, cst.Name) and element.value == name:
            return source
    return None


def _gate_read(
    rule: Rule, expr: cst.BaseExpression, parents: list[cst.CSTNode]
) -> cst.BaseExpression | None:
    """The gate cache ``expr`` reads (itself, an element or slice of it, a view of it, a loop
    variable over its elements)."""
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
    if isinstance(expr, cst.Name) and name is not None and not names.matches(name):
        source = _loop_source(name, parents, rule)  # `for g in self.g_cache`: one ring each
        ring = binding_name(source) if isinstance(source, (cst.Name, cst.Attribute)) else None
        return expr if ring is not None and names.matches(ring) else None
    if name is None or not names.matches(name) or names.is_plural(name):
        return None
    if rule.provenance.is_mapping(name, rule.site(), one_line(rule.context.module, expr)):
        return None
    return expr


def _judged_elsewhere(rule: Rule, call: cst.Call, parents: list[cst.CSTNode]) -> bool:
    """Whether the cast's result is bound, passed or stored where another check judges it: only
    a result that a computation uses at once (a method called on it, an operand) or that a
    local not named for a gate cache takes is reported here."""
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

        def migrate_slot(dst, src, slot, into):
            # a copy between two gate rings in the receiving ring's dtype
            dst.g_cache[into] = src.g_cache[slot].to(dst.g_cache.dtype)
            dst.d_cache[into].copy_(src.d_cache[slot].to(dst.d_cache.dtype))
        """
    ),
    Valid(
        """
        import torch

        def regrow(rings, static, n):
            # each ring receives its rows in its own dtype, whatever it is
            for ring in rings:
                ring[:n] = static.g_cache[:n].to(ring.dtype)
        """
    ),
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

        def migrate_slot(dst, src, slot, into):
            # rounded to bf16 on the way: the float32 ring receives bf16 log-decays
            dst.g_cache[into].copy_(src.g_cache[slot].bfloat16(), non_blocking=True)
        """,
        expected_fix="""
        import torch

        def migrate_slot(dst, src, slot, into):
            # rounded to bf16 on the way: the float32 ring receives bf16 log-decays
            dst.g_cache[into].copy_(src.g_cache[slot].to(torch.float32, copy=True), non_blocking=True)
        """,
        message_contains="and stored (a copy loses the precision",
    ),
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
    Invalid(
        """
        import torch

        class Pool:
            def export_states(self, idx):
                payload = []
                for d, gate in zip(self.d_cache, self.g_cache):
                    payload.append({"d": d[idx].clone(), "gate": gate[idx].to(self.wire_dtype)})
                return payload
        """,
        expected_fix="""
        import torch

        class Pool:
            def export_states(self, idx):
                payload = []
                for d, gate in zip(self.d_cache, self.g_cache):
                    payload.append({"d": d[idx].clone(), "gate": gate[idx].to(torch.float32)})
                return payload
        """,
        message_contains="gate cache `gate` is read and cast to a dtype that is not provably "
        "float32 by `.to(self.wire_dtype)` and stored",
    ),
)
