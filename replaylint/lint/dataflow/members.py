"""Dtypes a module fixes once: class constants and fields, properties, parameter defaults that
no caller in the module overrides, and torch's default dtype set by the module itself.

These answer ``dtype=self.GATE_DTYPE``, ``dtype=config.gate_dtype`` (a dataclass field or a
property of a class in the module), ``def alloc(shape, dtype=torch.float32)`` called without a
dtype, and ``torch.get_default_dtype()`` after ``torch.set_default_dtype(torch.float32)``. Only
the module itself is read: a caller in another module that passes a dtype is not seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import callers
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.returned_records import returned_field_dtypes
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.syntax.nodes import dotted_name, is_none_literal, keyword_arg, positional_args
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def attribute_dtype(
    prov: Provenance, attribute: cst.Attribute, site: Site, env: Env
) -> tuple[DtypeFact, ...] | None:
    """The dtypes ``<x>.<name>`` may be when ``name`` is a constant, field or property of the
    module's classes (of the enclosing class, for ``self.<name>``) and nothing in the module
    assigns ``<anything>.<name>``; None when unknown."""
    returned = returned_field_dtypes(prov, attribute, site)
    if returned is not None:  # `dtypes.gate` of `dtypes = cache_dtypes(...)`
        return returned
    name = attribute.attr.value
    receiver = attribute.value
    if isinstance(receiver, cst.Name) and receiver.value in {"self", "cls"}:
        owner = site.enclosing_class()
        classes = [owner] if owner is not None else []
    else:
        classes = prov.index.classes()
    # An instance may carry another value than its class's.
    if prov.index.assigns_attribute(name):
        return None
    values: list[tuple[cst.BaseExpression, Site]] = []
    for cls in classes:
        found = list(_class_values(cls, name))
        if not found:
            continue
        if _constructed_with(prov, cls, name):
            return None
        class_site = Site((prov.index.module, cls), None)
        values.extend((value, class_site) for value in found)
    if not values:
        return None
    facts = tuple(fact for value, where in values for fact in prov.dtype_facts(value, where, env))
    return None if any(fact.dtype is None for fact in facts) else facts


def parameter_default(prov: Provenance, binding: Binding, env: Env) -> tuple[DtypeFact, ...] | None:
    """The default's dtypes for a parameter that no call in the module passes; None otherwise."""
    default = _unpassed_default(prov, binding)
    if default is None:
        return None
    facts = prov.dtype_facts(default, Site((prov.index.module,), None), env)
    return None if any(fact.dtype is None for fact in facts) else facts


def float32_default(prov: Provenance, binding: Binding, env: Env) -> tuple[DtypeFact, ...] | None:
    """The default's dtypes for a parameter, whatever calls pass, when they prove float32 (the
    helper's own choice; a call that passes another dtype is wrong there); None otherwise."""
    param = binding.node
    if not isinstance(param, cst.Param) or param.default is None or param.star:
        return None
    facts = prov.dtype_facts(param.default, Site((prov.index.module,), None), env)
    if not facts or not all(fact.is_float32 for fact in facts):
        return None
    return tuple(DtypeFact(fact.dtype, fact.node, binding) for fact in facts)


def is_none(prov: Provenance, expr: cst.BaseExpression, site: Site) -> bool:
    """Whether ``expr`` is provably None: the literal, or a parameter defaulting to None that no
    call in the module passes (``dtype or torch.float32`` is then the right operand)."""
    if is_none_literal(expr):
        return True
    if not isinstance(expr, cst.Name):
        return False
    found = prov.lookup(expr.value, site)
    if not found or len(found) != 1 or found[0][0].kind != "param":
        return False
    default = _unpassed_default(prov, found[0][0])
    return default is not None and is_none_literal(default)


def returned_dtype(prov: Provenance, call: cst.Call, site: Site) -> tuple[DtypeFact, ...] | None:
    """The dtypes ``call`` returns when it calls a function of the module whose every return
    proves float32 (``def gate_dtype(): return torch.float32``); None otherwise."""
    found = called_function(prov.index, prov, call, site)
    if found is None:
        return None
    function, scopes, _ = found
    returns = prov.index.scope(function).returns
    if not returns or any(r.value is None for r, _ in returns):
        return None
    # the body sees its own bindings and the module's, not the caller's loop variables
    facts = tuple(
        fact
        for r, statement in returns
        if r.value is not None
        for fact in prov.dtype_facts(r.value, Site(scopes, statement))
    )
    return facts if facts and all(fact.is_float32 for fact in facts) else None


def _unpassed_default(prov: Provenance, binding: Binding) -> cst.BaseExpression | None:
    """The default of a parameter that no call in the module passes; None otherwise."""
    param, function = binding.node, binding.scope
    if not isinstance(param, cst.Param) or param.default is None:
        return None
    if not isinstance(function, cst.FunctionDef) or param.star:
        return None
    owner = _owning_class(prov, function)
    ordered = [p for p in function.params.posonly_params] + list(function.params.params)
    position = next((i for i, p in enumerate(ordered) if p is param), None)
    if owner is not None and position is not None:
        position -= 1  # `self` / `cls` is not passed
    if owner is not None and function.name.value == "__init__":
        calls = callers.constructor_calls(prov, owner)
    else:
        calls = list(prov.index.calls_named(function.name.value))
    if any(_passes(call, param.name.value, position) for call in calls):
        return None
    return param.default


def default_dtype(prov: Provenance, env: Env) -> tuple[DtypeFact, ...] | None:
    """``torch.get_default_dtype()`` when the module sets the default dtype, always to one
    literal; None otherwise."""
    facts: list[DtypeFact] = []
    for call in prov.index.calls_named("set_default_dtype"):
        if "torch.set_default_dtype" not in prov.index.qualified_names(call.func):
            continue
        args = positional_args(call)
        if len(args) != 1:
            return None
        found = prov.dtype_facts(args[0].value, Site((prov.index.module,), None), env)
        if any(fact.dtype is None for fact in found):
            return None
        facts.extend(found)
    return tuple(facts) or None


def _class_values(cls: cst.ClassDef, name: str) -> Iterator[cst.BaseExpression]:
    """What ``name`` is given in the class body: an assignment, a field default, a property
    returning a value."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                ):
                    yield small.value
                elif (
                    isinstance(small, cst.AnnAssign)
                    and isinstance(small.target, cst.Name)
                    and small.target.value == name
                    and small.value is not None
                ):
                    yield _field_default(small.value)
        elif isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            if not any(dotted_name(d.decorator) == "property" for d in statement.decorators):
                continue
            yield from _returns(statement)


def _field_default(value: cst.BaseExpression) -> cst.BaseExpression:
    """``field(default=x)`` -> ``x``; anything else as written."""
    if isinstance(value, cst.Call) and (dotted_name(value.func) or "").endswith("field"):
        default = keyword_arg(value, "default")
        if default is not None:
            return default.value
    return value


def _returns(function: cst.FunctionDef) -> Iterator[cst.BaseExpression]:
    stack: list[cst.CSTNode] = [function.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Return) and node.value is not None:
            yield node.value
        elif not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(syntax_children(node))


def _constructed_with(prov: Provenance, cls: cst.ClassDef, name: str) -> bool:
    """Whether a call of ``cls`` in the module may set ``name`` (a dataclass or NamedTuple)."""
    for call in prov.index.calls_named(cls.name.value):
        if keyword_arg(call, name) is not None or any(arg.star for arg in call.args):
            return True
        if positional_args(call) and _is_record(cls):
            return True  # fields passed in order: which one is which is not followed
    return False


def _is_record(cls: cst.ClassDef) -> bool:
    decorated = any(
        "dataclass" in (dotted_name(_callee(d.decorator)) or "") for d in cls.decorators
    )
    bases = {dotted_name(base.value) or "" for base in cls.bases}
    return decorated or any(base.endswith("NamedTuple") for base in bases)


def _callee(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.func if isinstance(node, cst.Call) else node


def _owning_class(prov: Provenance, function: cst.FunctionDef) -> cst.ClassDef | None:
    for cls in prov.index.classes():
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
        if any(statement is function for statement in body):
            return cls
    return None


def _passes(call: cst.Call, name: str, position: int | None) -> bool:
    if any(arg.star for arg in call.args) or keyword_arg(call, name) is not None:
        return True
    return position is not None and len(positional_args(call)) > position
