"""Operands that never change a floating tensor's dtype: Python numbers and 0-dim tensors.

``ring * 0.5``, ``g / temperature`` with ``temperature: float``, ``self.lower_bound * x`` where
the class sets ``self.lower_bound = config.gate_lower_bound`` (a field annotated ``float``) or
registers ``torch.tensor(bound)`` as a buffer: type promotion lets a dimensioned tensor keep its
dtype when it meets a number or a 0-dim tensor of the same category, so the result has the other
operand's dtype (a bf16 activation scaled by a float32 0-dim buffer stays bf16).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import callers
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.strings import NO_ENV, Env, bound_in
from replaylint.lint.syntax.nodes import (
    class_body_values,
    is_none_literal,
    literal_string,
    method_name,
    positional_args,
)
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_NUMBER_BUILTINS = frozenset({"float", "int"})
# calls that make a 0-dim tensor of one number
_ZERO_DIM_MAKERS = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
_REGISTERING = frozenset({"register_buffer", "register_parameter"})
_SEQUENCES = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.Set, cst.Dict)


def is_number(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> bool:
    """Whether ``expr`` is a Python number: a literal, a negated one, ``float(...)``,
    ``int(...)``, ``t.item()``, a parameter annotated ``float`` or ``int``, or a name bound to
    one of those."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, (cst.Minus, cst.Plus)):
        return is_number(prov, expr.expression, site, env)
    if isinstance(expr, cst.BinaryOperation):
        return is_number(prov, expr.left, site, env) and is_number(prov, expr.right, site, env)
    if isinstance(expr, cst.Call):
        if method_name(expr) == "item" and not expr.args:
            return True
        return isinstance(expr.func, cst.Name) and bool(
            prov.index.qualified_names(expr.func) & _NUMBER_BUILTINS
        )
    if isinstance(expr, cst.Name) and bound_in(env, expr) is None:
        found = prov.lookup(expr.value, site, env)
        return bool(found) and all(
            _number_binding(prov, binding, binding_site, env)
            for binding, binding_site in found or ()
        )
    return False


def _number_binding(prov: Provenance, binding: Binding, site: Site, env: Env) -> bool:
    if binding.kind == "param":
        annotation = binding.node.annotation if isinstance(binding.node, cst.Param) else None
        if annotation is not None:
            return (
                isinstance(annotation.annotation, cst.Name)
                and annotation.annotation.value in _NUMBER_BUILTINS
            )
        # every call of the module passes a number (`scale(g, 0.5)`)
        if not prov.enter():
            return False
        try:
            passed = callers.passed_values(prov, binding)
            return bool(passed) and all(is_number(prov, *value, NO_ENV) for value in passed or ())
        finally:
            prov.leave()
    return (
        binding.kind == "assign"
        and isinstance(binding.value, (cst.Integer, cst.Float, cst.UnaryOperation, cst.Call))
        and is_number(prov, binding.value, site, env)
    )


def is_scalar(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> bool:
    """Whether ``expr`` is a Python number or a 0-dim tensor (``torch.tensor(bound)``, an
    attribute the class sets to one, ``bound or DEFAULT``, a field annotated ``float``)."""
    if is_number(prov, expr, site, env):
        return True
    if not prov.enter():
        return False
    try:
        return _scalar(prov, expr, site, env)
    finally:
        prov.leave()


def _scalar(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> bool:
    if isinstance(expr, cst.Call):
        if not prov.index.qualified_names(expr.func) & _ZERO_DIM_MAKERS:
            return False
        args = positional_args(expr)
        return bool(args) and _one_number(prov, args[0].value, site, env)
    if isinstance(expr, cst.BooleanOperation):
        # `lower_bound or DEFAULT_LOWER_BOUND`: a number, or falsy and replaced by one
        return is_scalar(prov, expr.left, site, env) or is_scalar(prov, expr.right, site, env)
    if isinstance(expr, cst.IfExp):
        return all(
            is_none_literal(branch) or is_scalar(prov, branch, site, env)
            for branch in (expr.body, expr.orelse)
        )
    if isinstance(expr, cst.Name) and bound_in(env, expr) is None:
        found = prov.lookup(expr.value, site, env)
        return bool(found) and all(
            (
                binding.value is not None
                and binding.kind == "assign"
                and (is_none_literal(binding.value) or is_scalar(prov, binding.value, where, env))
            )
            or (
                binding.kind == "param"
                and isinstance(binding.node, cst.Param)
                and _number_parameter(binding.node)
            )
            for binding, where in found or ()
        )
    if isinstance(expr, cst.Attribute):
        return _scalar_attribute(prov, expr, site, env)
    return False


def _one_number(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> bool:
    """Whether the argument of ``torch.tensor(...)`` is one number, not a sequence."""
    if isinstance(expr, _SEQUENCES):
        return False
    if isinstance(expr, (cst.Attribute, cst.Subscript)):
        return True  # `torch.tensor(config.gate_logit_normalizer)`, `torch.tensor(header["base"])`
    return is_scalar(prov, expr, site, env)


# words that name a number a formula scales or bounds by (`lower_bound=None`, `temperature=1.0`)
_NUMBER_WORDS = re.compile(r"bound|scale|normali[sz]er|temperature|eps|factor|coef", re.IGNORECASE)


def _number_parameter(param: cst.Param) -> bool:
    """A parameter that holds a number: annotated as one, or with no annotation and a number
    as its default, or None as its default and a name that says it bounds or scales by one
    (``lower_bound=None``, ``gate_logit_normalizer=None``)."""
    if param.annotation is not None:
        return _numeric_annotation(param.annotation)
    default = param.default
    if isinstance(default, cst.UnaryOperation):
        default = default.expression
    if isinstance(default, (cst.Integer, cst.Float)):
        return True
    return (
        default is not None
        and is_none_literal(default)
        and _NUMBER_WORDS.search(param.name.value) is not None
    )


def _numeric_annotation(annotation: cst.Annotation | None) -> bool:
    """``float``, ``int``, ``float | None``, ``Optional[float]``."""
    if annotation is None:
        return False
    return _numeric_type(annotation.annotation)


def _numeric_type(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return node.value in _NUMBER_BUILTINS
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        parts = (node.left, node.right)
        return any(_numeric_type(p) for p in parts) and all(
            _numeric_type(p) or is_none_literal(p) for p in parts
        )
    if isinstance(node, cst.Subscript) and isinstance(node.value, (cst.Name, cst.Attribute)):
        name = node.value.value if isinstance(node.value, cst.Name) else node.value.attr.value
        elements = [s.slice for s in node.slice]
        return (
            name == "Optional"
            and len(elements) == 1
            and isinstance(elements[0], cst.Index)
            and _numeric_type(elements[0].value)
        )
    return False


def _scalar_attribute(prov: Provenance, attribute: cst.Attribute, site: Site, env: Env) -> bool:
    """``self.x`` that every assignment of the class sets to a scalar (or None), or a field
    annotated as a number in a class of the module (``config.gate_lower_bound``)."""
    name = attribute.attr.value
    receiver = attribute.value
    if _is_config(receiver):
        return True  # a setting: configs hold numbers, strings and dtypes, not tensors
    owner = site.enclosing_class()
    if isinstance(receiver, cst.Name) and receiver.value == "self" and owner is not None:
        values = list(instance_values(prov, owner, name))
        if values:
            return all(is_none_literal(v) or is_scalar(prov, v, where, env) for v, where in values)
        constants = class_body_values(owner, name)  # `gate_logit_normalizer = 16.0` in the class
        if constants:
            return is_number(prov, constants[0], Site((prov.index.module, owner), None), env)
    if name.endswith(_GATE_SCALARS) and not (
        isinstance(receiver, cst.Name) and receiver.value == "self"
    ):
        return True  # `attn.lower_bound` of another model object: KDA's gate hyper-parameters
    return any(_annotates_number(cls, name) for cls in prov.index.classes())


# the numbers KDA's gate is computed with: `lower_bound * sigmoid(...)`, `logsigmoid(f) / normalizer`
_GATE_SCALARS = ("lower_bound", "normalizer")


_CONFIG_NAMES = frozenset({"config", "cfg", "conf", "args", "hparams", "settings", "options"})
_CONFIG_SUFFIXES = ("_config", "_cfg", "_conf", "_args", "_settings")


def _is_config(receiver: cst.BaseExpression) -> bool:
    """``config``, ``self.config``, ``model.cfg``, ``decode_config``: an object of settings."""
    if isinstance(receiver, cst.Name):
        name = receiver.value
    elif isinstance(receiver, cst.Attribute):
        name = receiver.attr.value
    else:
        return False
    name = name.lower()
    return name in _CONFIG_NAMES or name.endswith(_CONFIG_SUFFIXES)


def _annotates_number(cls: cst.ClassDef, name: str) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.AnnAssign)
                and isinstance(small.target, cst.Name)
                and small.target.value == name
            ):
                return _numeric_annotation(small.annotation)
    return False


def instance_values(
    prov: Provenance, cls: cst.ClassDef, name: str
) -> Iterator[tuple[cst.BaseExpression, Site]]:
    """What the methods of ``cls`` assign to ``self.<name>`` or register under ``name``."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    module: ScopeNode = prov.index.module
    for method in body:
        if not isinstance(method, cst.FunctionDef):
            continue
        stack: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(method.body, None)]
        while stack:
            node, statement = stack.pop()
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                statement = node
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            where = Site((module, cls, method), statement)
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if _is_self_attribute(target.target, name):
                        yield node.value, where
                    elif isinstance(target.target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                        # `self.normalizer, self.scale = 16.0, d**-0.5`
                        names, values = target.target.elements, node.value.elements
                        if len(names) == len(values):
                            for written, value in zip(names, values, strict=True):
                                if _is_self_attribute(written.value, name):
                                    yield value.value, where
            elif isinstance(node, cst.AnnAssign) and _is_self_attribute(node.target, name):
                if _numeric_annotation(node.annotation):
                    yield cst.Integer("0"), where
                elif node.value is not None:
                    yield node.value, where
            elif isinstance(node, cst.Call) and method_name(node) in _REGISTERING:
                args = positional_args(node)
                if len(args) >= 2 and literal_string(args[0].value) == name:
                    yield args[1].value, where
            stack.extend((child, statement) for child in syntax_children(node))


def _is_self_attribute(target: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(target, cst.Attribute)
        and target.attr.value == name
        and isinstance(target.value, cst.Name)
        and target.value.value == "self"
    )


__all__ = ["instance_values", "is_number", "is_scalar"]
