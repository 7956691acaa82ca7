"""Tensors a model computes: its activations, whose dtype is the model's.

A log-decay worked out in the forward pass — ``lower_bound * torch.sigmoid(f)``,
``F.logsigmoid(self.f_proj(x)) / normalizer`` — has the dtype of the activations it starts from
when every other operand is a number or a 0-dim tensor, and a bf16 model's activations are bf16.
Such a gate ring is only float32 when something casts it. Which tensors count as activations:

* an argument of the function (not ``self``, not one annotated as a number or a string);
* the output of one of the module's layers: a call on an attribute of ``self``
  (``self.f_proj(x)``, ``self.attn.gate_projection(h)``) that is not a method the module defines;
* a weight of the module made in the model's dtype (``self.A_log = nn.Parameter(torch.empty(hv,
  dtype=dtype))``); one made float32 promotes what it meets, and is not one, unless the class
  itself casts it to float32 elsewhere (``self.A_log.float()`` in another branch or method, or a
  function of the module it is passed to): its own code expects it in another dtype at run time
  (a model cast, a checkpoint);
* the same weights and layers of another model object: ``attn.A_log`` and ``attn.a_proj(x)`` of
  an instance of a module class of this module (``for attn in model.layers``); of an object whose
  class the module does not show, KDA's gate parameters (``A_log``, ``dt_bias``) and its
  projections (``attn.a_proj(x)``);
* what views, indexing, elementwise functions and arithmetic with numbers make of those, and a
  matrix product with one of them (``x @ self.w_a``: both operands have one dtype).

A finding is placed at the step closest to the ring (``torch.where(filled, step, 0.0)``), where
one cast makes it float32.

The analysis asks this only of an expression whose dtype it cannot tell otherwise, and only where
something is *computed* (an elementwise function, arithmetic with a number): a ring passed
through unchanged keeps whatever dtype its maker chose and is checked there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import callers, records
from replaylint.lint.dataflow.facts import CastValue, Kind, TensorFact
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.imported_calls import layout_argument
from replaylint.lint.dataflow.instances import instance_classes
from replaylint.lint.dataflow.module_classes import module_classes
from replaylint.lint.dataflow.scalars import instance_values, is_scalar
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.strings import NO_ENV, Env, bound_in
from replaylint.lint.dataflow.torch_api import (
    DTYPE_PRESERVING_ATTRIBUTES,
    DTYPE_PRESERVING_METHODS,
    DTYPE_PRESERVING_WRAPPERS,
    ELEMENTWISE_METHODS,
    TORCH_ELEMENTWISE_FUNCTIONS,
)
from replaylint.lint.dataflow.widened import imported_upcasts
from replaylint.lint.syntax.nodes import (
    method_name,
    one_line,
    plain_element,
    positional_args,
    string_key,
)
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

# elementwise functions that compute new values (a reshape or a transpose computes nothing)
COMPUTING = frozenset(
    {
        "exp", "log", "log1p", "expm1", "neg", "negative", "abs", "sqrt", "rsqrt", "sigmoid",
        "tanh", "clamp", "clip", "clamp_min", "clamp_max", "cumsum", "cumprod", "logcumsumexp",
        "softmax", "log_softmax", "logsigmoid", "softplus", "silu", "relu", "elu",
    }
)  # fmt: skip
# methods of other objects, not layers: `self.pool.get(slot)` reads a store
_NOT_LAYERS = frozenset({"get", "pop", "get_tensor", "setdefault", "load", "read", "lookup"})
_NOT_TENSOR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "bytes", "dict", "list"})


def computes(name: str) -> bool:
    """Whether the elementwise function or method ``name`` (``torch.sigmoid``, ``exp``)
    computes new values."""
    return name.rpartition(".")[2] in COMPUTING


def activation_fact(
    prov: Provenance,
    node: cst.BaseExpression,
    source: cst.BaseExpression,
    site: Site,
    env: Env,
    facts: Sequence[TensorFact],
) -> TensorFact | None:
    """The fact of ``node``, computed from ``source`` (whose facts are ``facts``) by an
    elementwise step, when ``source`` is an activation; None otherwise.

    A function evaluated for one call sees its arguments' dtypes; when the call passes a tensor
    that is not float32 and the function computes the gate values from it with numbers only,
    the function is where a cast is missing, whatever this caller passes, so the fact is placed
    there too.
    """
    described: str | None
    if facts and all(f.kind is Kind.ACTIVATION for f in facts):
        # a step further from the activation: the finding moves to where the ring is formed
        # (`log_gate = torch.where(filled, step, 0.0)`), so one cast there fixes every path
        described = " and ".join(dict.fromkeys(f.detail for f in facts))
    elif all(f.kind is Kind.UNKNOWN for f in facts):
        described = activation_source(prov, source, site, env)
    elif any(f.kind not in _DECIDED for f in facts):
        described = activation_source(prov, source, site, env, passed_only=True)
    else:
        described = None
    if described is None:
        return None
    return TensorFact(Kind.ACTIVATION, node, detail=described, target=CastValue(node))


_DECIDED = frozenset({Kind.FLOAT32, Kind.NOT_FLOATING, Kind.UNKNOWN, Kind.ACTIVATION})


def activation_source(
    prov: Provenance,
    expr: cst.BaseExpression,
    site: Site,
    env: Env,
    *,
    passed_only: bool = False,
) -> str | None:
    """What ``expr`` is computed from when that is an activation (``"`f`, an argument of
    `log_decay`"``); None when it is computed from anything else. With ``passed_only``, only an
    argument of the function evaluated for a call counts."""
    if not prov.enter():
        return None
    try:
        return _Trace(prov, passed_only).source(expr, site, env, 0)
    finally:
        prov.leave()


_MAX_STEPS = 40  # a trace walks one expression step at a time: this bounds its length


@dataclass(frozen=True)
class _Trace:
    prov: Provenance
    passed_only: bool

    def source(self, expr: cst.BaseExpression, site: Site, env: Env, steps: int) -> str | None:
        if steps > _MAX_STEPS:
            return None
        steps += 1
        prov = self.prov
        if isinstance(expr, cst.Name):
            return self._name(expr, site, env, steps)
        if isinstance(expr, cst.Subscript):
            return (
                None if string_key(expr) is not None else self.source(expr.value, site, env, steps)
            )
        if isinstance(expr, cst.Attribute):
            if expr.attr.value in DTYPE_PRESERVING_ATTRIBUTES:
                return self.source(expr.value, site, env, steps)
            return None if self.passed_only else self._weight(expr, site)
        if isinstance(expr, cst.UnaryOperation) and isinstance(
            expr.operator, (cst.Minus, cst.Plus)
        ):
            return self.source(expr.expression, site, env, steps)
        if isinstance(expr, cst.BinaryOperation):
            operands = [o for o in (expr.left, expr.right) if not is_scalar(prov, o, site, env)]
            sources = [self.source(operand, site, env, steps) for operand in operands]
            if isinstance(expr.operator, cst.MatrixMultiply):
                # no promotion: both operands have one dtype (or torch raises), either tells it;
                # a product with one of the module's weights is a layer's output (`x @ self.w.T`)
                found = next((found for found in sources if found), None)
                if found is None and not self.passed_only:
                    found = next(
                        (
                            f"`{one_line(prov.index.module, expr)}`, a layer's output"
                            for operand in (expr.left, expr.right)
                            if self._module_weight(operand)
                        ),
                        None,
                    )
                return found
            return sources[0] if sources and all(sources) else None
        if isinstance(expr, cst.Call):
            return self._call(expr, site, env, steps)
        return None

    def _module_weight(self, operand: cst.BaseExpression) -> bool:
        """``self.w``, ``self.w.T``, ``self.w.t()``: a weight the module holds (not a ring)."""
        if isinstance(operand, cst.Call) and method_name(operand) in {"t", "transpose"}:
            operand = operand.func.value if isinstance(operand.func, cst.Attribute) else operand
        if isinstance(operand, cst.Attribute) and operand.attr.value in {"T", "mT"}:
            operand = operand.value
        return (
            isinstance(operand, cst.Attribute)
            and isinstance(operand.value, cst.Name)
            and operand.value.value == "self"
            and not self.prov.index.gate_caches.matches(operand.attr.value)
        )

    def _name(self, expr: cst.Name, site: Site, env: Env, steps: int) -> str | None:
        prov = self.prov
        names = prov.index.gate_caches
        if names.matches(expr.value):
            origin = names.learned_from(expr.value)
            if origin is None or not origin.guessed:
                return None  # a gate cache is checked where it is made
            # a local only guessed to be the ring is not checked where it is made (a forward's
            # `log_decay`): where it becomes a ring, what it is computed from decides
        bound = bound_in(env, expr)
        if bound is not None and not self.passed_only:
            # a loop variable, or the argument of the call being evaluated: what it holds
            return self.source(bound.expr, bound.site, bound.env(env), steps)
        found = prov.lookup(expr.value, site, env)
        if not found:
            return None
        described: str | None = None
        for binding, where in found:
            if binding.kind == "param" and isinstance(binding.node, cst.Param):
                found_here = self._parameter(binding, bound is not None, steps)
            elif binding.kind == "assign" and binding.value is not None:
                found_here = self.source(binding.value, where, env, steps)
            elif binding.kind == "assign" and not self.passed_only:
                unpacked = _unpacked_from(binding)  # `q, g, beta = self.proj(x).split(...)`
                found_here = self.source(unpacked, where, env, steps) if unpacked else None
                if found_here is None:  # `q, a, beta = self.project(x)`: what it returns there
                    found_here = self._returned_element(binding, where, steps)
            else:
                found_here = None
            # one way of making it from activations is enough: on that path the ring has the
            # model's dtype, whatever another branch does (`if fused: ... else: helper(...)`)
            described = described or found_here
        return described

    def _returned_element(self, binding: Binding, site: Site, steps: int) -> str | None:
        """The element a method of the module returns at the place ``binding`` unpacks, when
        every ``return`` of the method returns a tuple."""
        found = records.unpacked(binding)
        if found is None:
            return None
        call, position = found
        if not isinstance(call, cst.Call):
            return None
        called = called_function(self.prov.index, self.prov, call, site)
        if called is None:
            return None
        function, scopes, _ = called
        returns = self.prov.index.scope(function).returns
        described: str | None = None
        for returned, statement in returns:
            value = returned.value
            element = plain_element(value, position) if isinstance(value, cst.Tuple) else None
            found_here = (
                None
                if element is None
                else self.source(element, Site(scopes, statement), NO_ENV, steps)
            )
            if found_here is None:
                return None
            described = described or found_here
        return described

    def _weight(self, attribute: cst.Attribute, site: Site) -> str | None:
        """``self.A_log``: a parameter or buffer of the module made in the model's dtype
        (``torch.empty(hv, dtype=dtype)``, torch's default dtype). One made float32 stays float32
        (and promotes what it meets) unless the model is cast, which this module may not show;
        one loaded as stored may be float32 on purpose; one whose making is not understood is
        not known to be either."""
        receiver = attribute.value
        name = attribute.attr.value
        if self.prov.index.gate_caches.matches(name):
            return None
        found = self._model_object(receiver, site)
        if found is None:
            return None
        owner, text = found
        if owner is None:
            # a model object of a class this module does not show: KDA's gate parameters are
            # weights of the model, in its dtype unless something casts them
            if name not in GATE_WEIGHTS:
                return None
            return f"`{text}.{name}`, a gate weight of the model"
        described = f"`{text}.{name}`, a weight of `{owner.name.value}`"
        if name in self.prov.index.upcast_attributes(owner) or name in imported_upcasts(
            self.prov, owner
        ):
            # however it is made, the class's own code expects it in another dtype at run time
            return f"{described} that the class casts to float32 elsewhere"
        values = list(instance_values(self.prov, owner, name))
        if not values:
            return None
        for value, where in values:
            made = _weight_tensor(self.prov, value, where)
            if made is None:
                return None
            facts = self.prov.tensor_facts(made, where, NO_ENV)
            if not facts or any(f.kind not in _MODEL_DTYPE for f in facts):
                return None
        return described

    def _parameter(self, binding: Binding, passed: bool, steps: int) -> str | None:
        """An argument is an activation in a model's ``forward``, where the module's calls pass
        activations, and (``passed_only``) where the call being evaluated passes a tensor."""
        param = binding.node
        assert isinstance(param, cst.Param)
        if param.name.value in {"self", "cls"} or param.star or _not_a_tensor(param):
            return None
        function = binding.scope
        if not isinstance(function, cst.FunctionDef):
            return None
        described = f"`{param.name.value}`, an argument of `{function.name.value}`"
        if self.passed_only:
            return described if passed else None
        if function.name.value in {"forward", "__call__"}:
            return described
        values = callers.passed_values(self.prov, binding)
        if values and all(self.source(value, where, NO_ENV, steps) for value, where in values):
            return described
        return None

    def _call(self, call: cst.Call, site: Site, env: Env, steps: int) -> str | None:
        prov = self.prov
        method = method_name(call)
        func = call.func
        if isinstance(func, cst.Attribute) and method in _KEEPING_METHODS:
            return self.source(func.value, site, env, steps)
        if prov.index.qualified_names(func) & (
            TORCH_ELEMENTWISE_FUNCTIONS | DTYPE_PRESERVING_WRAPPERS
        ):  # `torch.sigmoid(x)`, `rearrange(x, "b n (h d) -> b n h d", h=h)`
            positional = positional_args(call)
            return self.source(positional[0].value, site, env, steps) if positional else None
        rearranged = layout_argument(prov, call, site)  # a project's own `rearrange(t, ...)`
        if rearranged is not None:
            return self.source(rearranged, site, env, steps)
        if (
            not self.passed_only
            and method not in _NOT_LAYERS
            and positional_args(call)
            and self._is_layer(func, site)
            and called_function(prov.index, prov, call, site) is None
        ):
            # not a method of the module (what one returns is followed elsewhere): a layer
            return f"`{one_line(prov.index.module, call)}`, a layer's output"
        return None

    def _is_layer(self, func: cst.BaseExpression, site: Site) -> bool:
        """``self.f_proj``, ``self.attn.g_proj``, or a part of another model object: ``attn.a_proj``
        of an instance of a module class of this module, or a projection (``*proj*``) of a model
        object whose class is not shown here."""
        if _on_self(func):
            return True
        if not isinstance(func, cst.Attribute):
            return False
        found = self._model_object(func.value, site)
        if found is None:
            return False
        return found[0] is not None or "proj" in func.attr.value.lower()

    def _model_object(
        self, receiver: cst.BaseExpression, site: Site
    ) -> tuple[cst.ClassDef | None, str] | None:
        """The class of a model object that holds weights and layers, with the receiver's text:
        ``self`` in a module class, an instance of one module class of this module (``attn`` of
        ``for attn in model.layers``), or (class None) a name or attribute chain of no class
        this module shows. None for anything else (a call, a literal, a non-module class)."""
        if isinstance(receiver, cst.Name) and receiver.value == "self":
            owner = site.enclosing_class()
            return None if owner is None else (owner, "self")
        if not isinstance(receiver, (cst.Name, cst.Attribute)) or _on_self(receiver):
            return None
        text = one_line(self.prov.index.module, receiver)
        classes = module_classes(self.prov)
        names = instance_classes(self.prov, classes, receiver, site)
        if names:
            owners = {classes.by_name.get(name) for name in names}
            owner = owners.pop() if len(owners) == 1 else None
            if owner is None or not classes.is_module(owner):
                return None
            return owner, text
        if isinstance(receiver, cst.Name) and _bound_to_no_model_object(self.prov, receiver, site):
            return None
        return None, text


_KEEPING_METHODS = DTYPE_PRESERVING_METHODS | ELEMENTWISE_METHODS
# KDA's gate parameters: `g = -A_log.exp() * softplus(a + dt_bias)`
GATE_WEIGHTS = frozenset({"A_log", "dt_bias"})


def _bound_to_no_model_object(prov: Provenance, name: cst.Name, site: Site) -> bool:
    """Whether ``name`` is bound here to something that is no model object: a literal, a
    comprehension, a number or string parameter."""
    for binding, _ in prov.lookup(name.value, site) or ():
        value = binding.value
        if binding.kind == "param" and isinstance(binding.node, cst.Param):
            if _not_a_tensor(binding.node):
                return True
        elif isinstance(
            value,
            (cst.Dict, cst.List, cst.Tuple, cst.BaseString, cst.Integer, cst.Float, cst.DictComp),
        ):
            return True
    return False


# what a weight in the model's dtype is made with
_MODEL_DTYPE = frozenset(
    {Kind.EXPLICIT, Kind.VARIABLE, Kind.INHERITED, Kind.CAST, Kind.PASSED, Kind.ACTIVATION}
)


def _weight_tensor(
    prov: Provenance, value: cst.BaseExpression, site: Site
) -> cst.BaseExpression | None:
    """``t`` of ``nn.Parameter(t)``, ``nn.Buffer(t)`` or ``register_buffer("x", t)``: the tensor
    a weight is made from; None when ``value`` makes no weight."""
    if isinstance(value, cst.Call) and prov.index.qualified_names(value.func) & (
        DTYPE_PRESERVING_WRAPPERS
    ):
        positional = positional_args(value)
        return positional[0].value if positional else None
    statement = site.statement
    registers = (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Call)
        and method_name(statement.body[0].value) == "register_buffer"
    )
    return value if registers else None


def _unpacked_from(binding: Binding) -> cst.BaseExpression | None:
    """The value a tuple target is unpacked from (``a, b = value``)."""
    statement = binding.statement
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        assign = statement.body[0]
        if isinstance(assign, cst.Assign) and isinstance(
            assign.targets[0].target, (cst.Tuple, cst.List)
        ):
            return assign.value
    return None


def _not_a_tensor(param: cst.Param) -> bool:
    annotation = param.annotation.annotation if param.annotation is not None else None
    if isinstance(annotation, cst.Name):
        return annotation.value in _NOT_TENSOR_ANNOTATIONS
    return isinstance(annotation, (cst.Subscript, cst.BinaryOperation)) and "Tensor" not in (
        cst.Module([]).code_for_node(annotation)
    )


def _on_self(func: cst.BaseExpression) -> bool:
    """``self.x`` or ``self.x.y`` (a layer of the module, or of one of its parts)."""
    depth = 0
    while isinstance(func, cst.Attribute) and depth < 3:
        func, depth = func.value, depth + 1
    return depth > 0 and isinstance(func, cst.Name) and func.value == "self"
