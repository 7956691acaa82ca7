"""Helpers that allocate one tensor per key of a mapping their caller passes.

``alloc_rings(shapes, dtype)``, defined in this module or in another module of the project as
``return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}``, gives every
key of the caller's mapping the one dtype the caller passes. Called with a mapping whose keys name
the gate cache (``{**shapes, "g_cache": g_shape}``, a local or an attribute of ``self`` bound to
such a dict, a function or method of the module that returns one), it allocates the gate cache in
that dtype. The keys are a lower bound: a key the analysis cannot read is left out, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.arguments import parameter_position, passed_values
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.helpers import CalledFunction, called_function
from replaylint.lint.dataflow.imported import MALFORMED, Context, Evaluation, There, Unknown
from replaylint.lint.dataflow.instances import instance_classes
from replaylint.lint.dataflow.module_classes import ModuleClasses, attribute_values
from replaylint.lint.dataflow.scopes import all_params
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import Here, as_value
from replaylint.lint.dataflow.torch_api import POSITIONAL_DTYPE, TORCH_FACTORIES
from replaylint.lint.project.index import External, Found
from replaylint.lint.syntax.nodes import keyword_arg, only_statement, positional_args
from replaylint.lint.syntax.sites import ScopeNode, Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_MAX_DEPTH = 4  # names and returns followed to reach a mapping's literal keys


@dataclass(frozen=True)
class KeyedAllocation:
    """A call of a helper that allocates every entry of the mapping it is given alike."""

    mapping: cst.BaseExpression
    """The mapping the call passes, as written at the call."""
    mapping_site: Site
    dtypes: tuple[DtypeFact, ...]
    """The dtype every entry gets."""
    passed: cst.BaseExpression | None
    """The argument the call passes for the helper's dtype; None when the helper's own
    default or a dtype written in the helper decides."""
    defined: cst.FunctionDef | str
    """The helper: its definition in this module, or where another module defines it
    (``pkg/ops.py:7``)."""


def keyed_allocation(prov: Provenance, call: cst.Call, site: Site) -> KeyedAllocation | None:
    """What ``call`` allocates, when it calls such a helper of the module or the project."""
    if not isinstance(call.func, (cst.Name, cst.Attribute)) or not call.args:
        return None
    local = called_function(prov.index, prov, call, site)
    if local is not None:
        return _module_helper(prov, call, site, local)
    if prov.project is None:
        return None
    try:
        return _project_helper(prov, call, site)
    except (Unknown, *MALFORMED):
        return None


def _module_helper(
    prov: Provenance,
    call: cst.Call,
    site: Site,
    found: CalledFunction,
) -> KeyedAllocation | None:
    function, scopes, bound = found
    returns = prov.index.scope(function).returns
    if len(returns) != 1 or returns[0][0].value is None:
        return None
    comprehension = returns[0][0].value
    shape = _per_key(comprehension) or _filled_per_key(function, comprehension)
    if shape is None:
        return None
    mapping_name, element = shape
    names = [p.name.value for p in all_params(function.params) if p.star == ""]
    names = names[1:] if bound else names
    if mapping_name not in names:
        return None
    element_site = Site(scopes, returns[0][1])
    if prov.index.qualified_names(element.func) & TORCH_FACTORIES:
        dtype = _dtype_argument(prov, element)
    else:  # `{name: alloc_ring(shape, dtype) for ...}` of an allocation helper of the module
        dtype = _helper_dtype_argument(prov, element, element_site)
    mapping = passed_values(
        prov, call, mapping_name, parameter_position(function, mapping_name, bound), site
    )
    if len(mapping) != 1 or dtype is None:
        return None
    defined = function
    helper_site = Site(scopes, returns[0][1])
    if isinstance(dtype, cst.Name) and dtype.value in names:
        passed = passed_values(
            prov, call, dtype.value, parameter_position(function, dtype.value, bound), site
        )
        if len(passed) == 1:
            facts = prov.dtype_facts(passed[0].value, passed[0].site)
            return KeyedAllocation(
                mapping[0].value, mapping[0].site, facts, passed[0].value, defined
            )
        if passed or any(arg.star for arg in call.args):
            return None
        default = _default(function, dtype.value)
        if default is None:
            return None
        facts = prov.dtype_facts(default, Site(scopes[:1], None))
        return KeyedAllocation(mapping[0].value, mapping[0].site, facts, None, defined)
    facts = prov.dtype_facts(dtype, helper_site)
    return KeyedAllocation(mapping[0].value, mapping[0].site, facts, None, defined)


def _project_helper(prov: Provenance, call: cst.Call, site: Site) -> KeyedAllocation | None:
    assert prov.project is not None
    value = as_value(prov, call, site, NO_ENV)  # None unless the callee reads an import
    if value is None:
        return None
    evaluation = Evaluation(prov, call)
    callee = evaluation.target(value[1], Context(prov.project.module))
    if not (isinstance(callee, Found) and callee.definition[0] == "function"):
        return None
    if callee.definition[3][0] != "per_key":
        return None
    result, inner = evaluation.called(callee, value[2], value[3], Context(prov.project.module))
    source, element = result[1], result[2]
    if source[0] != "param" or element[0] != "call":
        return None
    mapping = inner.params.get(str(source[1]))
    factory = evaluation.target(element[1], inner)
    if not isinstance(mapping, Here):
        return None
    if isinstance(factory, Found) and factory.definition[0] == "function":
        # `{name: alloc_ring(shape, dtype) for ...}`: the argument the allocation helper
        # allocates with
        dtype = _summary_dtype_argument(evaluation, factory, element)
    elif isinstance(factory, External) and factory.name in TORCH_FACTORIES:
        dtype = dict((str(k), v) for k, v in element[3]).get("dtype")
        if dtype is None and factory.name in POSITIONAL_DTYPE:
            position = POSITIONAL_DTYPE[factory.name]
            dtype = element[2][position] if len(element[2]) > position else None
    else:
        return None
    if dtype is None:
        return None  # the default dtype decides: RL003's question
    last = callee.origins[-1] if callee.origins else None
    defined = "another module" if last is None else f"{last.path}:{last.line}"
    passed = inner.params.get(str(dtype[1])) if dtype[0] == "param" else None
    if isinstance(passed, Here):
        facts = prov.dtype_facts(passed.expr, passed.site, passed.env)
        return KeyedAllocation(mapping.expr, mapping.site, facts, passed.expr, defined)
    if dtype[0] == "param" and not isinstance(passed, There):
        return None
    facts = tuple(evaluation.dtypes(dtype, inner))
    return KeyedAllocation(mapping.expr, mapping.site, facts, None, defined)


def _per_key(value: cst.BaseExpression) -> tuple[str, cst.Call] | None:
    """``{k: <call> for k, v in P.items()}``, ``{k: <call> for k in P}`` or ``dict(zip(P,
    (<call> for v in P.values())))``: ``(P, <call>)``."""
    zipped = _zipped_values(value)
    if zipped is not None:
        return zipped
    if not isinstance(value, cst.DictComp) or not isinstance(value.value, cst.Call):
        return None
    loop = value.for_in
    if loop.inner_for_in is not None or loop.ifs or loop.asynchronous is not None:
        return None
    source: cst.BaseExpression = loop.iter
    method = ""
    call = loop.iter
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value in {"items", "keys"}
        and not call.args
    ):
        source, method = call.func.value, call.func.attr.value
    key: cst.BaseExpression = loop.target
    if method == "items":
        if not (isinstance(key, cst.Tuple) and len(key.elements) == 2):
            return None
        key = key.elements[0].value
    if not (
        isinstance(source, cst.Name)
        and isinstance(key, cst.Name)
        and isinstance(value.key, cst.Name)
        and value.key.value == key.value
    ):
        return None
    return source.value, value.value


def _filled_per_key(
    function: cst.FunctionDef, returned: cst.BaseExpression
) -> tuple[str, cst.Call] | None:
    """``M = {}``, ``for k, v in P.items(): M[k] = <call>``, ``return M``: ``(P, <call>)`` (the
    plain form :mod:`replaylint.lint.project.filled_mappings` reads for other modules)."""
    body = list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []
    if body and _is_docstring(body[0]):
        body = body[1:]
    if len(body) != 3 or not isinstance(returned, cst.Name):
        return None
    made, loop = only_statement(body[0]), body[1]
    if not (
        isinstance(made, cst.Assign)
        and len(made.targets) == 1
        and isinstance(made.targets[0].target, cst.Name)
        and made.targets[0].target.value == returned.value
        and isinstance(made.value, cst.Dict)
        and not made.value.elements
        and isinstance(loop, cst.For)
        and loop.orelse is None
        and isinstance(loop.body, cst.IndentedBlock)
        and len(loop.body.body) == 1
    ):
        return None
    write = only_statement(loop.body.body[0])
    if not (
        isinstance(write, cst.Assign)
        and len(write.targets) == 1
        and isinstance(target := write.targets[0].target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and target.value.value == returned.value
        and len(target.slice) == 1
        and isinstance(index := target.slice[0].slice, cst.Index)
        and isinstance(index.value, cst.Name)
    ):
        return None
    comprehension = cst.DictComp(
        key=index.value,
        value=write.value,
        for_in=cst.CompFor(target=loop.target, iter=loop.iter),
    )
    return _per_key(comprehension)


def _is_docstring(line: cst.BaseStatement) -> bool:
    statement = only_statement(line)
    return isinstance(statement, cst.Expr) and isinstance(statement.value, cst.SimpleString)


def _zipped_values(value: cst.BaseExpression) -> tuple[str, cst.Call] | None:
    """``dict(zip(P, (<call> for v in P.values())))``: one call per key of ``P``, in order."""
    if not (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value == "dict"
        and len(value.args) == 1
    ):
        return None
    zipped = value.args[0].value
    if not (
        isinstance(zipped, cst.Call)
        and isinstance(zipped.func, cst.Name)
        and zipped.func.value == "zip"
        and len(zipped.args) == 2
        and isinstance(zipped.args[0].value, cst.Name)
    ):
        return None
    source, made = zipped.args[0].value.value, zipped.args[1].value
    if not isinstance(made, (cst.GeneratorExp, cst.ListComp)) or not isinstance(made.elt, cst.Call):
        return None
    loop = made.for_in
    over = loop.iter
    if (
        isinstance(over, cst.Call)
        and isinstance(over.func, cst.Attribute)
        and over.func.attr.value == "values"
        and not over.args
    ):
        over = over.func.value
    if loop.inner_for_in is not None or loop.ifs or not isinstance(over, cst.Name):
        return None
    return (source, made.elt) if over.value == source else None


def _helper_dtype_argument(
    prov: Provenance, call: cst.Call, site: Site
) -> cst.BaseExpression | None:
    """The argument of ``call`` that a helper of the module (``def alloc_ring(shape, dtype):
    return torch.zeros(shape, dtype=dtype)``) allocates its one tensor with."""
    found = called_function(prov.index, prov, call, site)
    if found is None:
        return None
    function, _, bound = found
    returns = prov.index.scope(function).returns
    made = returns[0][0].value if len(returns) == 1 else None
    if not isinstance(made, cst.Call) or not (
        prov.index.qualified_names(made.func) & TORCH_FACTORIES
    ):
        return None
    dtype = _dtype_argument(prov, made)
    if not isinstance(dtype, cst.Name):
        return None
    parameter = dtype.value
    if parameter not in {p.name.value for p in all_params(function.params)}:
        return None
    written = keyword_arg(call, parameter)
    if written is not None:
        return written.value
    position = parameter_position(function, parameter, bound)
    positional = positional_args(call)
    if position is None or position >= len(positional):
        return None
    return positional[position].value


def _summary_dtype_argument(
    evaluation: Evaluation, helper: Found, element: list[object]
) -> list[object] | None:
    """The argument value of the summary call ``element`` that the project's allocation helper
    ``helper`` allocates its one tensor with."""
    _, _, params, made = helper.definition[:4]
    if not (isinstance(made, list) and made and made[0] == "call"):
        return None
    try:
        factory = evaluation.target(made[1], Context(helper.module))
    except (Unknown, *MALFORMED):
        return None
    if not (isinstance(factory, External) and factory.name in TORCH_FACTORIES):
        return None
    dtype = dict((str(k), v) for k, v in made[3]).get("dtype")
    if not (isinstance(dtype, list) and dtype and dtype[0] == "param"):
        return None
    names = [str(p[0]) for p in params]
    parameter = str(dtype[1])
    if parameter not in names:
        return None
    keywords = element[3]
    assert isinstance(keywords, list)
    for key, value in keywords:
        if key == parameter:
            return value  # type: ignore[no-any-return]
    positional = element[2]
    assert isinstance(positional, list)
    position = names.index(parameter)
    return positional[position] if position < len(positional) else None


def _dtype_argument(prov: Provenance, allocation: cst.Call) -> cst.BaseExpression | None:
    written = keyword_arg(allocation, "dtype")
    if written is not None:
        return written.value
    for factory in prov.index.qualified_names(allocation.func) & POSITIONAL_DTYPE.keys():
        positional = positional_args(allocation)
        if len(positional) > POSITIONAL_DTYPE[factory]:
            return positional[POSITIONAL_DTYPE[factory]].value
    return None


def _default(function: cst.FunctionDef, name: str) -> cst.BaseExpression | None:
    for param in all_params(function.params):
        if param.name.value == name:
            return param.default
    return None


# ------------------------------------------------------------------ a mapping's keys
def known_keys(prov: Provenance, expr: cst.BaseExpression, site: Site) -> frozenset[str]:
    """The string keys ``expr``'s dict provably has on some way it may be made."""
    return frozenset(_keys(prov, expr, site, 0))


def _keys(prov: Provenance, expr: cst.BaseExpression, site: Site, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    deeper = depth + 1
    if isinstance(expr, cst.Dict):
        for element in expr.elements:
            if isinstance(element, cst.DictElement):
                key = prov.string_value(element.key, site)
                if key is not None:
                    yield key
            else:  # `{**shapes, "g_cache": g_shape}`
                yield from _keys(prov, element.value, site, deeper)
    elif isinstance(expr, cst.DictComp):
        loop = expr.for_in
        if loop.inner_for_in is None and not loop.ifs:
            for env in prov.iterations(loop.target, loop.iter, site) or ():
                key = prov.string_value(expr.key, site, env)
                if key is not None:
                    yield key
    elif isinstance(expr, cst.Name):
        for binding, binding_site in prov.lookup(expr.value, site) or ():
            if binding.kind == "assign" and binding.value is not None:
                yield from _keys(prov, binding.value, binding_site, deeper)
    elif isinstance(expr, cst.Attribute):
        for value, value_site in _self_attribute(prov, expr, site):
            yield from _keys(prov, value, value_site, deeper)
    elif isinstance(expr, cst.Call):
        for returned, returned_site in _returned(prov, expr, site):
            yield from _keys(prov, returned, returned_site, deeper)


def _self_attribute(
    prov: Provenance, expr: cst.Attribute, site: Site
) -> Iterator[tuple[cst.BaseExpression, Site]]:
    """What the methods of the enclosing class assign to ``self.<attr>``."""
    if not (isinstance(expr.value, cst.Name) and expr.value.value == "self"):
        return
    owner = site.enclosing_class()
    if owner is None:
        return
    key = ("assigned_attributes", id(owner))
    assigned = prov.index.memo.get(key)
    if assigned is None:
        assigned = prov.index.memo[key] = {}
        for attribute, value, value_site in attribute_values(_classes(prov, site), owner):
            assigned.setdefault(attribute, []).append((value, value_site))
    yield from assigned.get(expr.attr.value, ())


def _classes(prov: Provenance, site: Site) -> ModuleClasses:
    """The module's top-level classes and the class of ``site``: enough for the attributes of
    ``self`` and the classes of its values, without a walk of the whole module."""
    module = prov.index.module
    top = [s for s in module.body if isinstance(s, cst.ClassDef)]
    by_name = {cls.name.value: cls for cls in reversed(top)}  # the first definition wins
    scopes: dict[int, tuple[ScopeNode, ...]] = {id(cls): (module, cls) for cls in top}
    owner = site.enclosing_class()
    if owner is not None:
        scopes[id(owner)] = site.scopes[:-1]
    return ModuleClasses(by_name, scopes)


def _returned(
    prov: Provenance, call: cst.Call, site: Site
) -> Iterator[tuple[cst.BaseExpression, Site]]:
    """What the one ``return`` of the module's function or method ``call`` runs returns; also
    for a method of an attribute of ``self`` (``self.spec.shapes()``) whose values are
    instances of module classes."""
    found = called_function(prov.index, prov, call, site)
    if found is not None:
        yield from _one_return(prov, found[0], found[1])
        return
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)):
        return
    classes = _classes(prov, site)
    for value, value_site in _self_attribute(prov, func.value, site):
        for name in instance_classes(prov, classes, value, value_site) or ():
            cls = classes.by_name.get(name)
            if cls is None:
                continue
            for statement in cls.body.body:
                if (
                    isinstance(statement, cst.FunctionDef)
                    and statement.name.value == func.attr.value
                ):
                    yield from _one_return(prov, statement, (*classes.scopes[id(cls)], statement))


def _one_return(
    prov: Provenance, function: cst.FunctionDef, scopes: tuple[ScopeNode, ...]
) -> Iterator[tuple[cst.BaseExpression, Site]]:
    returns = prov.index.scope(function).returns
    if len(returns) == 1 and returns[0][0].value is not None:
        yield returns[0][0].value, Site(scopes, returns[0][1])
