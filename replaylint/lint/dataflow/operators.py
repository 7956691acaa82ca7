"""Expressions that compute a tensor from others: arithmetic, elementwise functions, joins.

``-torch.rand(shape, dtype=torch.bfloat16)``, ``ring * 0.1``, ``F.logsigmoid(x)``, ``g.cumsum(-1)``
keep the dtype of the tensor they start from; ``a * b``, ``torch.where(m, a, b)`` and
``torch.cat([a, b])`` have the *promoted* dtype of their tensor operands, so a float32 part makes
the result float32 (``cat`` of a float32 ring with bf16 padding is float32) and an operand whose
dtype is not known leaves the result unknown. Python numbers never change a floating dtype. A
``dtype=`` argument (``torch.cumsum(x, -1, dtype=...)``) decides the result as a cast does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import activations
from replaylint.lint.dataflow.allocations import dtype_source
from replaylint.lint.dataflow.facts import (
    CastValue,
    Kind,
    SetDtype,
    TensorFact,
    all_not_floating,
)
from replaylint.lint.dataflow.scalars import is_number, is_scalar
from replaylint.lint.dataflow.strings import Env, bound_in
from replaylint.lint.dataflow.torch_api import (
    BINARY_METHODS,
    ELEMENTWISE_METHODS,
    FLOATING_RANK,
    TORCH_BINARY_FUNCTIONS,
    TORCH_CONCATENATIONS,
    TORCH_ELEMENTWISE_FUNCTIONS,
)
from replaylint.lint.syntax.nodes import (
    is_name,
    keyword_arg,
    method_name,
    one_line,
    positional_args,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_ARITHMETIC = (
    cst.Add,
    cst.Subtract,
    cst.Multiply,
    cst.Divide,
    cst.FloorDivide,
    cst.Modulo,
    cst.Power,
    cst.MatrixMultiply,
)
_JOINED = ("tensors", "input")


def operator_facts(
    prov: Provenance, expr: cst.UnaryOperation | cst.BinaryOperation, site: Site, env: Env
) -> Iterator[TensorFact]:
    """``-x`` and ``+x`` keep ``x``'s dtype; ``a <op> b`` has the promoted dtype."""
    if isinstance(expr, cst.UnaryOperation):
        if isinstance(expr.operator, (cst.Minus, cst.Plus)):
            yield from prov.tensor_facts(expr.expression, site, env)
        else:
            yield TensorFact(Kind.UNKNOWN, expr)
        return
    if not isinstance(expr.operator, _ARITHMETIC):
        yield TensorFact(Kind.UNKNOWN, expr)
        return
    yield from promoted(prov, expr, ((expr.left, site), (expr.right, site)), env)


def call_facts(
    prov: Provenance,
    call: cst.Call,
    names: set[str],
    receiver: cst.BaseExpression | None,
    site: Site,
    env: Env,
) -> tuple[TensorFact, ...] | None:
    """The facts of an elementwise call or a join; None when ``call`` is neither.

    ``receiver`` is ``x`` in a method call ``x.f(...)``; None for a function call.
    """
    positional = [arg.value for arg in positional_args(call)]
    if names & TORCH_ELEMENTWISE_FUNCTIONS:
        if not positional:
            return (TensorFact(Kind.UNKNOWN, call),)
        return _elementwise(prov, call, positional[0], site, env)
    binary = next((TORCH_BINARY_FUNCTIONS[n] for n in names if n in TORCH_BINARY_FUNCTIONS), None)
    if binary is not None:
        if len(positional) <= max(binary):
            return (TensorFact(Kind.UNKNOWN, call),)
        return tuple(promoted(prov, call, [(positional[i], site) for i in binary], env))
    if names & TORCH_CONCATENATIONS:
        joined = positional[0] if positional else None
        for keyword in _JOINED:
            if joined is None and (arg := keyword_arg(call, keyword)) is not None:
                joined = arg.value
        parts = _parts(prov, joined, site, env) if joined is not None else None
        if parts is None:
            return (TensorFact(Kind.UNKNOWN, call),)
        return tuple(promoted(prov, call, parts, env))
    method = method_name(call)
    if method is None or receiver is None:
        return None
    if method in ELEMENTWISE_METHODS:
        return _elementwise(prov, call, receiver, site, env)
    if method in BINARY_METHODS and positional:
        return tuple(promoted(prov, call, ((receiver, site), (positional[0], site)), env))
    return None


def _elementwise(
    prov: Provenance, call: cst.Call, source: cst.BaseExpression, site: Site, env: Env
) -> tuple[TensorFact, ...]:
    dtype_arg = keyword_arg(call, "dtype")
    if dtype_arg is None:
        source_facts = prov.tensor_facts(source, site, env)
        name = method_name(call) or next(iter(prov.index.qualified_names(call.func)), "")
        if activations.computes(name):
            computed = activations.activation_fact(prov, call, source, site, env, source_facts)
            if computed is not None:
                return (computed,)
        return source_facts
    facts = prov.dtype_facts(dtype_arg.value, site, env)
    if all(f.is_float32 for f in facts):
        return (TensorFact(Kind.FLOAT32, call, dtypes=facts),)
    if all_not_floating(facts):
        return (TensorFact(Kind.NOT_FLOATING, call, dtypes=facts),)
    return (
        TensorFact(
            Kind.CAST,
            dtype_arg.value,
            call=call,
            dtypes=facts,
            detail=f"`dtype={one_line(prov.index.module, dtype_arg.value)}`",
            target=SetDtype(dtype_arg.value),
        ),
    )


def promoted(
    prov: Provenance,
    node: cst.BaseExpression,
    operands: Sequence[tuple[cst.BaseExpression, Site]],
    env: Env,
) -> Iterator[TensorFact]:
    """The facts of a result with the promoted dtype of ``operands`` (numbers left out)."""
    kept = [
        (operand, where) for operand, where in operands if not is_scalar(prov, operand, where, env)
    ]
    tensors = [prov.tensor_facts(operand, where, env) for operand, where in kept]
    if len(tensors) > 1:
        tensors = [_operand_facts(prov, *k, env, t) for k, t in zip(kept, tensors, strict=True)]
    if not tensors:
        yield TensorFact(Kind.UNKNOWN, node)
        return
    if len(tensors) == 1:
        if len(kept) < len(operands):
            # an activation scaled or shifted by a number: the activations' dtype
            computed = activations.activation_fact(prov, node, *kept[0], env, tensors[0])
            if computed is not None:
                yield computed
                return
        yield from tensors[0]
        return
    floating = [facts for facts in tensors if not all(f.kind is Kind.NOT_FLOATING for f in facts)]
    if floating and all(any(f.kind is Kind.ACTIVATION for f in facts) for facts in floating):
        # model tensors combined (`-self.A_log.exp() * F.softplus(self.a_proj(x))`): still the
        # model's dtype; one finding for the result, not one per operand. An operand made
        # another way too (`if fused: rows = ... else: rows = helper(...)`) has the model's
        # dtype on the way the others do
        # (a mask multiplied in keeps it: `* filled`)
        detail = " and ".join(
            dict.fromkeys(
                f.detail for facts in floating for f in facts if f.kind is Kind.ACTIVATION
            )
        )
        yield TensorFact(Kind.ACTIVATION, node, detail=detail, target=CastValue(node))
        return
    ranks = [_rank(facts) for facts in tensors]
    if any(rank is None for rank in ranks):
        yield TensorFact(Kind.UNKNOWN, node)  # an operand of unknown dtype may promote it
        return
    if any(prov.all_float32(facts) for facts in tensors) and max(r or 0 for r in ranks) <= 2:
        yield TensorFact(Kind.FLOAT32, node)
        return
    if not floating:
        yield TensorFact(Kind.UNKNOWN, node)
        return
    for facts in floating:
        yield from (f for f in facts if f.kind is not Kind.FLOAT32)


def _operand_facts(
    prov: Provenance,
    operand: cst.BaseExpression,
    site: Site,
    env: Env,
    facts: tuple[TensorFact, ...],
) -> tuple[TensorFact, ...]:
    """An operand's facts; one of unknown dtype that is a weight or an activation of the model
    (``self.A_log`` in ``self.A_log * x``) has the model's dtype."""
    if facts and all(f.kind is Kind.UNKNOWN for f in facts):
        computed = activations.activation_fact(prov, operand, operand, site, env, facts)
        if computed is not None:
            return (computed,)
    if facts and all(
        f.kind is Kind.INHERITED and f.allocation is not None and f.allocation.kind != "factory"
        for f in facts
    ):
        # `log_decay.new_zeros(...)` padding `log_decay`: the activation's dtype, one finding
        # for the join rather than one for the padding
        made = {id(f.allocation.call): f.allocation for f in facts if f.allocation}
        source = dtype_source(prov.index, next(iter(made.values()))) if len(made) == 1 else None
        source_facts = prov.tensor_facts(source, site, env) if source is not None else ()
        kinds = {f.kind for f in source_facts}
        if Kind.ACTIVATION in kinds:  # the padding has its source's dtype on every path
            return source_facts
    return facts


def _rank(facts: Sequence[TensorFact]) -> int | None:
    """The highest promotion rank ``facts`` may give a tensor; None when one is unknown."""
    highest = 0
    for fact in facts:
        if fact.kind is Kind.FLOAT32:
            highest = max(highest, 2)
        elif fact.kind is Kind.NOT_FLOATING:
            continue
        elif fact.kind is Kind.UNKNOWN:
            return None
        elif fact.kind is Kind.ACTIVATION:
            highest = max(highest, 1)  # the model's dtype: bf16, fp16 or float32
        else:
            literals = [d.dtype for d in fact.dtypes]
            known = [FLOATING_RANK.get(d) for d in literals if d is not None]
            if None in literals or None in known or not known:
                # a dtype that may be anything (a variable, torch's default, a load)
                highest = max(highest, 1)
                continue
            highest = max(highest, *(k for k in known if k is not None))
    return highest


def _parts(
    prov: Provenance, joined: cst.BaseExpression, site: Site, env: Env
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """The tensors a join combines: a literal sequence's elements, one comprehension element."""
    if isinstance(joined, (cst.List, cst.Tuple)):
        if any(isinstance(e, cst.StarredElement) for e in joined.elements):
            return None
        return [(element.value, site) for element in joined.elements]
    if isinstance(joined, (cst.ListComp, cst.GeneratorExp)):
        return [(joined, site)]  # its facts are its element's, with the loop variable bound
    if (
        isinstance(joined, cst.BinaryOperation)
        and isinstance(joined.operator, cst.Multiply)
        and isinstance(joined.left, (cst.List, cst.Tuple))
        and is_number(prov, joined.right, site, env)
    ):
        return _parts(prov, joined.left, site, env)  # `[ring] * layers`
    if isinstance(joined, cst.Name) and bound_in(env, joined) is None:
        found = prov.lookup(joined.value, site, env)
        if found and len(found) == 1 and found[0][0].kind == "param":
            return [(joined, site)]  # a sequence the callers pass: its elements' facts
        if found and len(found) == 1 and found[0][0].kind == "assign":
            value = found[0][0].value
            if isinstance(value, cst.List) and not value.elements:
                return _appended(joined.value, site)  # `parts = []`, `parts.append(...)`
            # only a sequence made for this join: a fix of one of its parts changes no other use
            if not prov.index.read_once(found[0][0]):
                return None
            if isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp)):
                return _parts(prov, value, found[0][1], env)  # where the sequence was written
    return None


def _appended(name: str, site: Site) -> list[tuple[cst.BaseExpression, Site]] | None:
    """What the function appends to its empty list ``name``, when the list is read nowhere but
    in those appends and the join: each appended value, where it is appended."""
    parts: list[tuple[cst.BaseExpression, Site]] = []
    reads = 0
    for line in descendants(site.scope):
        if isinstance(line, cst.Name) and line.value == name:
            reads += 1
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            call = small.value if isinstance(small, cst.Expr) else None
            if (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "append"
                and is_name(call.func.value, name)
                and len(call.args) == 1
                and not call.args[0].star
            ):
                parts.append((call.args[0].value, Site(site.scopes, line)))
    # the binding, the appends and this join: no other read may change what it holds
    return parts if parts and reads == len(parts) + 2 else None
