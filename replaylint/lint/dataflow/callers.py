"""Parameters whose dtype the module's own calls decide: ``seed_ring(prefill_gates(), 4)``.

Inside a function a tensor parameter's dtype is not known. When the module calls the function
itself, and every such call passes a tensor of one known floating dtype other than float32
(``x.to(torch.bfloat16)``, a helper that returns one, an element of the tuple a helper
returns, spread with ``*`` or unpacked first), what the function computes from the parameter
keeps that dtype: a ``PASSED`` fact. A call the analysis cannot read (``**kwargs``, a method
called on another object) leaves the parameter unknown, as does a call that passes float32 or a
tensor of unknown dtype. Calls from other modules are not seen.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.facts import DtypeFact, Kind, TensorFact, definite_dtype
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.torch_api import FLOAT32, NON_FLOATING_DTYPES
from replaylint.lint.syntax.nodes import (
    decorated,
    dotted_name,
    is_none_literal,
    keyword_arg,
    read_names,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_Value = tuple[cst.BaseExpression, Site]
Passed = tuple[str, ...] | tuple[TensorFact, ...] | None
"""The one dtype (or dtypes) the calls pass, or what they pass computed from activations."""


def passed_facts(
    prov: Provenance, binding: Binding, use: cst.Name
) -> tuple[TensorFact, ...] | None:
    """What the module's calls pass for the parameter ``binding``, read at ``use``; None when
    that is not one known dtype."""
    passed = prov.passed_dtypes(binding, lambda: _passed_dtypes(prov, binding))
    if passed is None:
        return None
    dtypes = tuple(dtype for dtype in passed if isinstance(dtype, str))
    if not dtypes:
        # the calls pass values computed from their activations: that is what arrives here
        return tuple(fact for fact in passed if isinstance(fact, TensorFact))
    if dtypes == (FLOAT32,):
        return (TensorFact(Kind.FLOAT32, use),)
    facts = tuple(DtypeFact(dtype, use, binding, parameter=binding.name) for dtype in dtypes)
    if all(dtype in NON_FLOATING_DTYPES for dtype in dtypes):
        return (TensorFact(Kind.NOT_FLOATING, use, dtypes=facts),)
    function = binding.scope
    assert isinstance(function, cst.FunctionDef)
    named = " or ".join(f"torch.{dtype}" for dtype in dtypes)
    owner = _owner(prov, function) if function.name.value == "__init__" else None
    called = owner.name.value if owner is not None else function.name.value
    detail = f"`{binding.name}`, which the calls of `{called}` in this module pass as {named}"
    return (TensorFact(Kind.PASSED, use, dtypes=facts, detail=detail),)


def _passed_dtypes(prov: Provenance, binding: Binding) -> Passed:
    values = passed_values(prov, binding)
    if not values:
        return None  # not called in the module, or a call that cannot be read
    dtypes: set[str] = set()
    facts = [fact for value in values for fact in _value_facts(prov, *value)]
    kinds = {fact.kind for fact in facts}
    if Kind.ACTIVATION in kinds and kinds <= {Kind.ACTIVATION, Kind.FLOAT32}:
        return tuple(facts)  # computed from activations on some path: that arrives here
    for fact in facts:
        dtype = definite_dtype(fact)
        if dtype is None:
            return None
        dtypes.add(dtype)
    if not dtypes or (FLOAT32 in dtypes and len(dtypes) > 1):
        return None  # called with float32 as well: not decided
    return tuple(sorted(dtypes))


def passed_dtype_facts(prov: Provenance, binding: Binding) -> tuple[DtypeFact, ...] | None:
    """The dtypes the module's calls pass for the dtype parameter ``binding``
    (``alloc(shape, torch.float32)``, ``cls(..., gate_dtype=config.gate_dtype)``), each marked
    with its call; None when the module does not call the function, a call cannot be read, or
    one leaves a None default that the function does not replace (torch's default dtype). A
    call that leaves another default passes that default.

    Float32 from every call decides the parameter (calls from other modules are not seen, as for
    a default no call overrides). Anything else is the callers' choice only for
    a parameter meant for the gate cache (named for its dtype, or read once: by the gate
    cache's allocation); a general ``dtype`` that the d and k rings take too is the
    allocation's to override, and stays a parameter."""
    passed = _passed_by_calls(prov, binding)
    if not passed:
        return None
    function = binding.scope
    assert isinstance(function, cst.FunctionDef)  # a parameter of a function the module calls
    rebound = len(prov.index.scope(function).bindings.get(binding.name, ())) > 1
    if any(call is None and is_none_literal(value) and not rebound for call, (value, _) in passed):
        return None  # left to a None default: torch's default dtype, decided elsewhere
    if not prov.enter():
        return None
    try:
        # a call that leaves a None default to `if dtype is None: dtype = ...` passes nothing;
        # one that leaves another default passes that
        facts = tuple(
            replace(fact, parameter=binding.name, passed_by=call)
            for call, (value, site) in passed
            if not (call is None and is_none_literal(value))
            for fact in prov.dtype_facts(value, site)
        )
    finally:
        prov.leave()
    if facts and all(fact.is_float32 for fact in facts):
        return facts
    reads = [name for name in read_names(function.body) if name.value == binding.name]
    meant = prov.index.gate_caches.names_gate_dtype(binding.name) or (
        len(reads) == 1 and not _in_dtype_entry(function, reads[0])
    )
    return facts if meant else None


def _in_dtype_entry(function: cst.FunctionDef, read: cst.Name) -> bool:
    """Whether ``read`` is the ``dtype`` entry of a dict (``{"dtype": dtype, ...}``,
    ``dict(dtype=dtype)``): keyword arguments that may be spread into every ring's allocation."""
    for node in descendants(function.body):
        if isinstance(node, cst.Dict) and any(
            isinstance(e, cst.DictElement) and e.value is read for e in node.elements
        ):
            return True
        if (
            isinstance(node, cst.Call)
            and dotted_name(node.func) == "dict"
            and any(arg.keyword is not None and arg.value is read for arg in node.args)
        ):
            return True
    return False


def passed_values(prov: Provenance, binding: Binding) -> list[_Value] | None:
    """What each call of the module passes for the parameter ``binding`` (its default where a
    call does not pass it); None when a call cannot be read."""
    passed = _passed_by_calls(prov, binding)
    return None if passed is None else [value for _, value in passed]


def _passed_by_calls(
    prov: Provenance, binding: Binding
) -> list[tuple[cst.Call | None, _Value]] | None:
    """What each call of the module passes for the parameter ``binding``, with the call (None
    where the call leaves the parameter to its default); None when a call cannot be read."""
    function, param = binding.scope, binding.node
    if not isinstance(function, cst.FunctionDef) or not isinstance(param, cst.Param):
        return None
    if param.star or binding.name in {"self", "cls"}:
        return None
    ordered = [*function.params.posonly_params, *function.params.params]
    position = next((i for i, p in enumerate(ordered) if p is param), None)
    sites = prov.index.call_sites()
    values: list[tuple[cst.Call | None, _Value]] = []
    for call, bound in _calls_of(prov, function):
        site = sites.get(id(call))
        if site is None or call is None:
            return None
        index = None if position is None else position - (1 if bound else 0)
        value = _argument(prov, call, site, param, index)
        if value is None:
            return None
        values.append((None if value[1].statement is None else call, value))
    return values


def _calls_of(prov: Provenance, function: cst.FunctionDef) -> list[tuple[cst.Call | None, bool]]:
    """The module's calls of ``function``, each with whether it passes ``self`` itself;
    ``(None, False)`` for a call that may be one but cannot be told apart."""
    sites = prov.index.call_sites()
    found: list[tuple[cst.Call | None, bool]] = []
    if function.name.value == "__init__":
        owner = _owner(prov, function)
        if owner is None:
            return [(None, False)]
        # a constructor call runs `__init__` with the new instance as `self`
        return [(call, True) for call in constructor_calls(prov, owner)]
    for call in prov.index.calls_named(function.name.value):
        site = sites.get(id(call))
        made = called_function(prov.index, prov, call, site) if site is not None else None
        if made is None:
            if isinstance(call.func, cst.Attribute):
                found.append((None, False))  # `obj.method(...)` may be a call of this method
            continue
        if made[0] is function:
            found.append((call, made[2]))
    return found


def constructor_calls(prov: Provenance, owner: cst.ClassDef) -> list[cst.Call]:
    """The module's calls that construct ``owner``: ``Owner(...)``, and ``cls(...)`` in one of
    its classmethods."""
    calls = list(prov.index.calls_named(owner.name.value))
    for method in owner.body.body:
        if isinstance(method, cst.FunctionDef) and decorated(method, "classmethod"):
            first = method.params.params[0].name.value if method.params.params else None
            named = prov.index.calls_named(first) if first is not None else ()
            calls.extend(call for call in named if prov.within(call, method))
    return calls


def _owner(prov: Provenance, function: cst.FunctionDef) -> cst.ClassDef | None:
    """The class whose body defines ``function``."""
    return next((c for c in prov.index.classes() if any(s is function for s in c.body.body)), None)


def _argument(
    prov: Provenance, call: cst.Call, site: Site, param: cst.Param, index: int | None
) -> _Value | None:
    """What ``call`` passes for ``param`` (its ``index``-th positional parameter)."""
    passed = keyword_arg(call, param.name.value)
    if passed is not None:  # a `**spread` beside it cannot pass it again
        return passed.value, site
    if any(arg.star == "**" for arg in call.args):
        return None
    positional: list[_Value] = []
    for arg in call.args:
        if arg.keyword is not None:
            continue
        if arg.star == "*":
            spread = _elements(prov, arg.value, site)
            if spread is None:
                return None
            positional.extend(spread)
        else:
            positional.append((arg.value, site))
    if index is not None and index < len(positional):
        return positional[index]
    if param.default is not None:
        return param.default, Site((prov.index.module,), None)
    return None


def _elements(prov: Provenance, expr: cst.BaseExpression, site: Site) -> list[_Value] | None:
    """The elements of a tuple ``expr`` holds: a literal, or what a helper of the module returns
    (one tuple literal, so that each element is one expression)."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        if any(isinstance(e, cst.StarredElement) for e in expr.elements):
            return None
        return [(e.value, site) for e in expr.elements]
    if not isinstance(expr, cst.Call):
        return None
    found = called_function(prov.index, prov, expr, site)
    if found is None:
        return None
    function, scopes, _ = found
    returns = prov.index.scope(function).returns
    if len(returns) != 1 or not isinstance(returns[0][0].value, (cst.Tuple, cst.List)):
        return None
    returned, statement = returns[0]
    assert returned.value is not None
    return _elements(prov, returned.value, Site(scopes, statement))


def _value_facts(prov: Provenance, expr: cst.BaseExpression, site: Site) -> tuple[TensorFact, ...]:
    """``expr``'s facts; a name unpacked from a helper's tuple (``_, x = inputs()``) is that
    element."""
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site)
        if found and len(found) == 1 and found[0][0].kind == "assign" and found[0][0].value is None:
            element = _unpacked(prov, found[0][0], found[0][1])
            if element is not None:
                return prov.tensor_facts(*element)
    return prov.tensor_facts(expr, site)


def _unpacked(prov: Provenance, binding: Binding, site: Site) -> _Value | None:
    statement = binding.statement
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    position = next((i for i, e in enumerate(target.elements) if e.value is binding.node), None)
    elements = _elements(prov, assign.value, site)
    if position is None or elements is None or len(elements) != len(target.elements):
        return None
    return elements[position]
