"""Calls of callables the module writes itself: what they return, evaluated for that call.

``self.g_cache = self._alloc()`` (a method or function of the module that returns, or a generator
that yields, an allocation), ``alloc = functools.partial(torch.zeros, dtype=torch.bfloat16)`` and
``alloc = lambda shape, dtype=torch.bfloat16: torch.zeros(shape, dtype=dtype)`` called later, and
dataclass fields ``field(default_factory=lambda: torch.zeros(...))``. The callable's body is
evaluated with its parameters bound to the call's arguments (or their defaults).

Fix targets stay where they are only when they change nothing but this call's result: a target
inside a callable that other calls use too becomes a cast of this call's result (for a fresh
allocation) or no fix; a ``dtype`` a helper function takes from its caller is RL006's question
(it checks the argument each call passes), so such facts are left unknown here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import records
from replaylint.lint.dataflow.defaults import default_dtype_fact
from replaylint.lint.dataflow.facts import (
    AddDtypeArgument,
    Allocation,
    CastValue,
    Kind,
    TensorFact,
)
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.module_classes import is_static
from replaylint.lint.dataflow.scopes import Binding, all_params
from replaylint.lint.dataflow.strings import NO_ENV, Bound, Env, Iteration
from replaylint.lint.dataflow.taken_returns import taken_returns
from replaylint.lint.dataflow.torch_api import PARTIALS, TORCH_FACTORIES, TORCH_LOADERS
from replaylint.lint.syntax.nodes import (
    keyword_arg,
    method_name,
    positional_args,
    read_names,
)
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

# builtins whose result holds what their one argument yields: `list(rings())`, `next(rings())`
_SEQUENCE_BUILDERS = frozenset({"list", "tuple", "next", "iter"})


def callable_facts(
    prov: Provenance, call: cst.Call, site: Site, env: Env, element: int | None = None
) -> tuple[TensorFact, ...] | None:
    """The facts of ``call``'s result when it calls a callable of the module; None otherwise.
    With ``element``, of that element of the tuple it returns (``d, k, g = load_rings()``)."""
    func = call.func
    if element is not None:
        if isinstance(func, cst.Name) or (
            isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
        ):
            found_function = called_function(prov.index, prov, call, site)
            if found_function is not None:
                function, scopes, bound = found_function
                return _function(prov, function, scopes, bound, call, site, env, element)
        return None
    names = prov.index.qualified_names(func)
    if "dataclasses.field" in names or (isinstance(func, cst.Name) and func.value == "field"):
        default = keyword_arg(call, "default")
        if default is not None:
            return prov.tensor_facts(default.value, site, env)
        factory = keyword_arg(call, "default_factory")
        if factory is None:
            return None
        return _made_by(prov, factory.value, None, site, env)
    if isinstance(func, cst.Name) and func.value in _SEQUENCE_BUILDERS and func.value in names:
        args = positional_args(call)
        if len(args) == 1 and len(call.args) == 1:  # list(ring_generator())
            return prov.tensor_facts(args[0].value, site, env)
        return None
    if isinstance(func, cst.Name) or (
        # `self.mixer.log_decay(a)`: a method of the module class an attribute holds
        isinstance(func, cst.Attribute)
        and isinstance(func.value, (cst.Name, cst.Call, cst.Attribute))
    ):
        return _made_by(prov, func, call, site, env)
    return None


def _made_by(
    prov: Provenance,
    maker: cst.BaseExpression,
    call: cst.Call | None,
    site: Site,
    env: Env,
) -> tuple[TensorFact, ...] | None:
    """What ``maker(...)`` returns, for ``call`` (None: called without arguments)."""
    if isinstance(maker, cst.Lambda):
        return _lambda(prov, maker, call, site, site, env, shared=False)
    if isinstance(maker, cst.Call) and prov.index.qualified_names(maker.func) & PARTIALS:
        return _partial(prov, maker, call, site, site, env, shared=False)
    if isinstance(maker, cst.Name) and maker.value not in env:
        found = prov.lookup(maker.value, site, env)
        if found and len(found) == 1 and found[0][0].kind == "assign":
            binding, binding_site = found[0]
            shared = not prov.index.read_once(binding) or _importable(binding.name, binding_site)
            value = binding.value
            if isinstance(value, cst.Lambda):
                return _lambda(prov, value, call, site, binding_site, env, shared=shared)
            if isinstance(value, cst.Call) and prov.index.qualified_names(value.func) & PARTIALS:
                return _partial(prov, value, call, site, binding_site, env, shared=shared)
            return None
    probe = call if call is not None else cst.Call(func=maker)
    found_function = called_function(prov.index, prov, probe, site)
    if (
        found_function is None
        and call is not None
        and isinstance(maker, cst.Attribute)
        and isinstance(maker.value, cst.Attribute)
    ):
        held = _held_method(prov, call, site)
        if held is None:
            return None
        facts = _function(prov, *held, call, site, env)
        # a method that tells nothing leaves the call what it was: a layer's output
        return None if facts is None or all(f.kind is Kind.UNKNOWN for f in facts) else facts
    if found_function is None:
        return None
    function, scopes, bound = found_function
    return _function(prov, function, scopes, bound, call, site, env)


def _held_method(
    prov: Provenance, call: cst.Call, site: Site
) -> tuple[cst.FunctionDef, tuple[ScopeNode, ...], bool] | None:
    """``self.mixer.prompt_log_decay(a)``: the method of the one module class the attribute
    holds (not a static method)."""
    from replaylint.lint.dataflow.instances import method_of_instance

    if not prov.enter():
        return None
    try:
        found = method_of_instance(prov, call, site)
    finally:
        prov.leave()
    if found is None or is_static(found[0]):
        return None
    return found[0], found[1], True


def returned_values(
    prov: Provenance, call: cst.Call, site: Site, env: Env
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """What a call of a function of the module may return: the value of each ``return`` the
    call can reach (its parameters bound to the call's arguments or defaults); None when the
    call is not one of the module's or its arguments cannot be bound."""
    found = called_function(prov.index, prov, call, site)
    if found is None:
        return None
    function, scopes, bound = found
    bound_env = _call_env(prov, function, scopes, bound, call, site, env)
    if bound_env is None:
        return None
    scope = prov.index.scope(function)
    return [
        (r.value, Site(scopes, statement))
        for r, statement in taken_returns(prov, scope, scopes, bound_env)
        if r.value is not None
    ]


def _call_env(
    prov: Provenance,
    function: cst.FunctionDef,
    scopes: tuple[ScopeNode, ...],
    bound: bool,
    call: cst.Call | None,
    site: Site,
    env: Env,
) -> dict[str, str | Bound] | None:
    """``function``'s parameters bound to the arguments of ``call`` (or their defaults); None
    when they cannot be read. A function sees its parameters, not the caller's loop variables;
    a parameter rebound in the body (``f = f.view(...)``) is read there as its own, not as the
    argument of this call, so it is left out."""
    definition_site = Site(scopes[:-1], function)
    bound_env = _arguments(prov, function.params, call, site, definition_site, env, {}, skip=bound)
    if bound_env is None:
        return None
    scope = prov.index.scope(function)
    rebound = [name for name in bound_env if len(scope.bindings.get(name, ())) > 1]
    return {k: v for k, v in bound_env.items() if k not in rebound}


def _function(
    prov: Provenance,
    function: cst.FunctionDef,
    scopes: tuple[ScopeNode, ...],
    bound: bool,
    call: cst.Call | None,
    site: Site,
    env: Env,
    element: int | None = None,
) -> tuple[TensorFact, ...] | None:
    scope = prov.index.scope(function)
    bound_env = _call_env(prov, function, scopes, bound, call, site, env)
    if bound_env is None:
        return None
    values = _yields(function)
    if values is None or (values and element is not None):
        return None
    # a generator's call makes no tensor: the cast of its result is no fix
    result = None if values else call
    values = values or [
        (r.value, statement)
        for r, statement in taken_returns(prov, scope, scopes, bound_env)
        if r.value is not None
    ]
    if not values:
        return None
    name = function.name.value
    # another module may call a public function or method too
    shared = len(prov.index.calls_named(name)) > 1 or not name.startswith("_")
    # `self.dtype` is the instance's setting, not a value each call passes
    parameters = {p.name.value for p in all_params(function.params)} - {"self", "cls"}
    facts: list[TensorFact] = []
    for value, statement in values:
        where = Site(scopes, statement)
        if element is not None:
            returned = records.field_value(prov, value, element, where, bound_env)
            if returned is None:
                return None  # a return whose element is not known
            value, where = returned.value, returned.site
            result = None  # the cast of one element is no cast of the call
        for fact in prov.tensor_facts(value, where, bound_env):
            if fact.kind in {Kind.EXPLICIT, Kind.VARIABLE} and (
                _takes_parameter(fact, parameters)
                or any(
                    d.parameter is not None or (call is not None and prov.within(d.node, call))
                    for d in fact.dtypes
                )
            ):
                # the dtype is a parameter of the helper: RL006 checks what each call passes
                facts.append(TensorFact(Kind.UNKNOWN, fact.node))
                continue
            facts.append(_localised(prov, fact, function, result, shared))
    return tuple(facts) or None


def _lambda(
    prov: Provenance,
    function: cst.Lambda,
    call: cst.Call | None,
    site: Site,
    lambda_site: Site,
    env: Env,
    *,
    shared: bool,
) -> tuple[TensorFact, ...] | None:
    bound_env = _arguments(prov, function.params, call, site, lambda_site, env, env, skip=False)
    if bound_env is None:
        return None
    facts = prov.tensor_facts(function.body, lambda_site, bound_env)
    return tuple(_localised(prov, fact, function, call, shared) for fact in facts)


def _partial(
    prov: Provenance,
    partial: cst.Call,
    call: cst.Call | None,
    site: Site,
    partial_site: Site,
    env: Env,
    *,
    shared: bool,
) -> tuple[TensorFact, ...] | None:
    """``functools.partial(torch.zeros, dtype=...)`` called: the call's keywords win."""
    args = positional_args(partial)
    if not args or any(arg.star for arg in (*partial.args, *(call.args if call else ()))):
        return None
    factories = sorted(prov.index.qualified_names(args[0].value) & TORCH_FACTORIES)
    if not factories:
        return None
    dtype_arg = keyword_arg(call, "dtype") if call is not None else None
    if dtype_arg is not None:
        allocation = Allocation(call, "factory", factories[0], dtype_arg)  # type: ignore[arg-type]
        return (prov.dtype_decided(allocation, ((dtype_arg.value, site),), env),)
    dtype_arg = keyword_arg(partial, "dtype")
    if dtype_arg is not None:
        allocation = Allocation(partial, "factory", factories[0], dtype_arg)
        fact = prov.dtype_decided(allocation, ((dtype_arg.value, partial_site),), env)
        if shared and fact.target is not None:
            # the call's own `dtype=` overrides the partial's, for this call alone; the finding
            # is about this call, not the partial the other calls share
            if call is None:
                fact = replace(fact, target=None)
            else:
                fact = replace(fact, node=call, target=AddDtypeArgument(call))
        return (fact,)
    made = call if call is not None else partial
    return (default_dtype_fact(prov, Allocation(made, "factory", factories[0], None), site, env),)


def _arguments(
    prov: Provenance,
    params: cst.Parameters,
    call: cst.Call | None,
    call_site: Site,
    definition_site: Site,
    env: Env,
    visible: Env,
    *,
    skip: bool,
) -> dict[str, str | Bound] | None:
    """``visible`` with each parameter bound to its argument (read with the caller's ``env``)
    or its default; None when that cannot be read (``*args``, a missing argument)."""
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
        return None
    passed: Sequence[cst.Arg] = call.args if call is not None else ()
    if any(arg.star for arg in passed):
        return None
    ordered = [*params.posonly_params, *params.params]
    if skip:
        ordered = ordered[1:]
    positional = [arg for arg in passed if arg.keyword is None]
    if len(positional) > len(ordered):
        return None
    outer = tuple(sorted(env.items()))
    bound: dict[str, str | Bound] = dict(visible)
    for position, param in enumerate([*ordered, *params.kwonly_params]):
        name = param.name.value
        argument: cst.Arg | None = None
        if position < len(ordered) and position < len(positional):
            argument = positional[position]
        elif call is not None:
            argument = keyword_arg(call, name)
        if argument is not None:
            bound[name] = Bound(argument.value, call_site, outer)
        elif param.default is not None:
            bound[name] = Bound(param.default, definition_site, ())
        else:
            return None
    return bound


def _localised(
    prov: Provenance,
    fact: TensorFact,
    root: cst.CSTNode,
    call: cst.Call | None,
    shared: bool,
) -> TensorFact:
    """``fact`` from inside ``root`` as the caller sees it (see the module docstring)."""
    if any(prov.index.gate_caches.matches(b.name) for b in fact.via):
        return TensorFact(Kind.FLOAT32, fact.node, detail="a gate cache")  # checked where bound
    local = replace(fact, via=(), uses=())
    target = fact.target
    if target is None:
        return local
    inside = prov.within(target.node, root)
    if inside and fact.via and not all(prov.index.read_once(b) for b in fact.via):
        return replace(local, target=None)  # the callable's local has other uses
    if inside and shared and fact.kind is Kind.ACTIVATION:
        return local  # computed by the callable itself: reported there, cast by the caller
    if inside and shared:
        fresh = fact.allocation is not None and prov.within(fact.allocation.call, root)
        cast = CastValue(call) if fresh and call is not None else None
        # the finding is about this call, not the callable the other calls share
        return replace(local, node=call if call is not None else local.node, target=cast)
    return local


def _importable(name: str, site: Site) -> bool:
    """Whether ``name`` is a public module-level name another module may import."""
    return len(site.scopes) == 1 and not name.startswith("_")


def _takes_parameter(fact: TensorFact, parameters: set[str]) -> bool:
    """Whether the allocation behind ``fact`` reads its dtype from one of ``parameters``."""
    allocation = fact.allocation
    if allocation is None:
        return False
    dtype_args = [arg for arg in allocation.call.args if arg.star == "**"]
    if allocation.dtype_arg is not None:
        dtype_args.append(allocation.dtype_arg)
    return any(name.value in parameters for arg in dtype_args for name in read_names(arg.value))


def _yields(function: cst.FunctionDef) -> list[tuple[cst.BaseExpression, cst.CSTNode]] | None:
    """Every ``yield <value>`` of a generator function, with the statement it is in; None when
    it also yields from another iterable (not followed)."""
    found: list[tuple[cst.BaseExpression, cst.CSTNode]] = []

    def walk(node: cst.CSTNode, statement: cst.CSTNode) -> None:
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            statement = node
        if isinstance(node, cst.Yield):
            if isinstance(node.value, cst.BaseExpression):
                found.append((node.value, statement))
            elif node.value is not None:
                raise _YieldFrom
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and node is not function:
            return
        for child in syntax_children(node):
            walk(child, statement)

    try:
        walk(function.body, function)
    except _YieldFrom:
        return None
    return found


class _YieldFrom(Exception):
    pass


# tensor methods whose result unpacks into parts of the receiver's dtype
_SPLITTING_METHODS = frozenset({"split", "chunk", "unbind", "tensor_split", "split_with_sizes"})


def element_binding_facts(
    prov: Provenance, binding: Binding, site: Site, env: Env
) -> tuple[TensorFact, ...] | None:
    """What a name bound to one element of a value holds: ``d, k, g = value`` (that element),
    ``for ring in rings`` (any element of ``rings``: a list, a comprehension, a generator of the
    module, rows of a tensor); None when not followed."""
    if binding.kind == "assign":
        unpacked = records.unpacked(binding)
        if unpacked is None:
            return None
        return element_facts(prov, unpacked[0], unpacked[1], site, env)
    loop = binding.statement
    if binding.kind != "loop" or not isinstance(loop, cst.For) or loop.target is not binding.node:
        return None
    facts = prov.tensor_facts(loop.iter, site, env)
    # what a fix would change is the iterable, which may hold more than this element
    return tuple(replace(f, target=None) for f in facts)


def _comprehension_element(
    prov: Provenance,
    value: cst.ListComp | cst.GeneratorExp,
    position: int,
    site: Site,
    env: Env,
) -> tuple[TensorFact, ...] | None:
    """Element ``position`` of ``d, k, g = (torch.zeros(s, dtype=act) for s in shapes)``: what
    the comprehension makes in that iteration (in any iteration when they are not known). The
    one expression makes every element, so changing its dtype is no fix of one of them."""
    loop = value.for_in
    if loop.inner_for_in is not None or loop.ifs:
        return None
    iterations = prov.iterations(loop.target, loop.iter, site)
    if iterations is None:
        iterations = _zipped_iterations(prov, loop, position, site)
    here = {**env, **iterations[position]} if iterations and position < len(iterations) else env
    return tuple(replace(f, target=None) for f in prov.tensor_facts(value.elt, site, here))


def _zipped_iterations(
    prov: Provenance, loop: cst.CompFor, position: int, site: Site
) -> list[Iteration] | None:
    """For ``for s, t in zip(shapes, (act, act, torch.float32))``: the iterations of the zipped
    literals alone (``t``), when the others (``shapes``) are not known."""
    iterable, target = loop.iter, loop.target
    if not (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Name)
        and iterable.func.value == "zip"
        and isinstance(target, cst.Tuple)
        and len(target.elements) == len(iterable.args)
        and not any(arg.star or arg.keyword for arg in iterable.args)
    ):
        return None
    merged: list[Iteration] = []
    for element, arg in zip(target.elements, iterable.args, strict=True):
        found = prov.iterations(element.value, arg.value, site)
        if found is None:
            continue
        while len(merged) < len(found):
            merged.append({})
        for iteration, env in zip(merged, found, strict=False):
            iteration.update(env)
    return merged if len(merged) > position else None


def element_facts(
    prov: Provenance, value: cst.BaseExpression, position: int, site: Site, env: Env = NO_ENV
) -> tuple[TensorFact, ...] | None:
    """The facts of element ``position`` of ``value`` (``d, k, g = value``); None when the
    element is not known."""
    held = records.field_value(prov, value, position, site, env)
    if held is not None:
        return prov.tensor_facts(held.value, held.site, env)
    if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
        return _comprehension_element(prov, value, position, site, env)
    if not isinstance(value, cst.Call):
        return None
    returned = callable_facts(prov, value, site, env, element=position)
    if returned is not None:
        return returned
    method = method_name(value)
    if prov.index.qualified_names(value.func) & TORCH_LOADERS or method in _SPLITTING_METHODS:
        # every part has the whole's dtype; a cast of the whole is no fix of one part
        return tuple(replace(f, target=None) for f in prov.tensor_facts(value, site, env))
    return None
