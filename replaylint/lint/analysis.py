"""Shared analysis for rules: what is a gate cache binding, an allocation, a dtype.

Rules ask questions here instead of pattern-matching syntax themselves, so every rule recognises
the same spellings (``import torch as th``, ``from torch import zeros``, ``nn.Parameter(...)``,
``caches["g_cache"] = ...``) in the same way. How a bound value's dtype was decided — through
local bindings, casts, loads — is :mod:`replaylint.lint.provenance`'s question.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dtypes import dtype_from_qualified_name
from replaylint.lint.rule import Rule
from replaylint.lint.scopes import ScopeNode, Site

# torch factories that create a tensor whose dtype is given by ``dtype=`` or the default dtype.
TORCH_FACTORIES: frozenset[str] = frozenset(
    f"torch.{name}"
    for name in (
        "empty",
        "zeros",
        "ones",
        "full",
        "rand",
        "randn",
        "empty_strided",
        "tensor",
        "as_tensor",
    )
)
# torch factories that follow their first argument's dtype unless ``dtype=`` is given.
TORCH_LIKE_FACTORIES: frozenset[str] = frozenset(
    f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full", "rand", "randn")
)
# Tensor methods that allocate with the receiver's dtype unless ``dtype=`` is given.
NEW_METHODS: frozenset[str] = frozenset(
    {"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
)
# Positional index of ``dtype`` where the factory accepts it positionally.
_POSITIONAL_DTYPE: dict[str, int] = {"torch.as_tensor": 1}

AllocationKind = Literal["factory", "like", "new"]


@dataclass(frozen=True)
class Allocation:
    """A call that allocates a tensor, and the argument that sets its dtype (if any)."""

    call: cst.Call
    kind: AllocationKind
    function: str
    dtype_arg: cst.Arg | None


@dataclass(frozen=True)
class GateCacheBinding:
    """An expression that becomes a gate cache: ``<target> = <value>`` in one of its spellings."""

    name: str
    """The gate-cache name as matched (``g_cache``)."""
    display: str
    """How the target reads in source (``self.g_cache``, ``caches["g_cache"]``)."""
    value: cst.BaseExpression
    statement: cst.CSTNode
    site: Site
    """Where ``value`` is evaluated (for following local bindings)."""


def binding_name(target: cst.BaseExpression) -> str | None:
    """The name a target binds: ``x`` -> x, ``a.b.x`` -> x, ``d["x"]`` -> x."""
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute):
        return target.attr.value
    if isinstance(target, cst.Subscript):
        return string_key(target)
    return None


def string_key(subscript: cst.Subscript) -> str | None:
    if len(subscript.slice) != 1:
        return None
    index = subscript.slice[0].slice
    if isinstance(index, cst.Index):
        return literal_string(index.value)
    return None


def literal_string(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def call_names(context: FileContext, call: cst.Call) -> set[str]:
    return context.qualified_names(call.func)


def method_name(call: cst.Call) -> str | None:
    """``x.foo(...)`` -> ``"foo"``."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def method_receiver(context: FileContext, call: cst.Call) -> cst.BaseExpression | None:
    """``x`` in ``x.foo(...)`` when that is a method call on a value, not ``module.function()``."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    if isinstance(func.value, (cst.Name, cst.Attribute)) and context.imported_names(func.value):
        return None
    return func.value


def keyword_arg(call: cst.Call, keyword: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and arg.star == ""]


def as_allocation(context: FileContext, expr: cst.BaseExpression) -> Allocation | None:
    """Describe ``expr`` if it is a tensor allocation we know the dtype semantics of."""
    if not isinstance(expr, cst.Call):
        return None
    for name in call_names(context, expr):
        kind: AllocationKind
        if name in TORCH_FACTORIES:
            kind = "factory"
        elif name in TORCH_LIKE_FACTORIES:
            kind = "like"
        else:
            continue
        dtype_arg = keyword_arg(expr, "dtype")
        if dtype_arg is None and name in _POSITIONAL_DTYPE:
            positional = positional_args(expr)
            if len(positional) > _POSITIONAL_DTYPE[name]:
                dtype_arg = positional[_POSITIONAL_DTYPE[name]]
        return Allocation(expr, kind, name, dtype_arg)
    method = method_name(expr)
    if method in NEW_METHODS and method_receiver(context, expr) is not None:
        return Allocation(expr, "new", method, keyword_arg(expr, "dtype"))
    return None


def literal_dtype(context: FileContext, expr: cst.BaseExpression) -> str | None:
    """The canonical dtype ``expr`` names (``th.half`` -> ``"float16"``), or None if not literal."""
    for name in context.qualified_names(expr):
        dtype = dtype_from_qualified_name(name)
        if dtype is not None:
            return dtype
    return None


_VISITOR_NAMES: dict[type, tuple[str, ...]] = {}


class GateCacheRule(Rule):
    """A rule about the values that become gate caches.

    Finds every binding of a gate cache — assignment (plain, annotated, tuple, walrus), dict
    literal entry, keyword argument, ``register_buffer``/``setattr`` — and hands each to
    :meth:`check_binding`. Subclasses that visit ``Call`` themselves must call ``super()``.
    """

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._scopes: list[ScopeNode] = [context.module]
        self._statements: list[cst.CSTNode] = []

    def check_binding(self, binding: GateCacheBinding) -> None:
        raise NotImplementedError

    def get_visitors(self) -> Mapping[str, Callable[[cst.CSTNode], None]]:
        """libcst's own version inspects every attribute of the instance (thousands of no-op
        stubs) for each file; the names depend only on the class, so they are found once."""
        names = _VISITOR_NAMES.get(type(self))
        if names is None:
            names = _VISITOR_NAMES[type(self)] = tuple(
                name
                for name in dir(type(self))
                if name.startswith(("visit_", "leave_"))
                and callable(method := getattr(type(self), name))
                and getattr(method, "__name__", "").startswith(("visit_", "leave_"))
                and not getattr(method, "_is_no_op", False)
            )
        return {name: getattr(self, name) for name in names}

    # Where we are: the enclosing scopes and the innermost statement, for local dataflow.
    def site(self) -> Site:
        return Site(tuple(self._scopes), self._statements[-1] if self._statements else None)

    # libcst's batched traversal only dispatches methods whose own name is visit_*/leave_*, so
    # each statement kind gets its two one-line methods.
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._statements.append(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self._statements.pop()

    def visit_If(self, node: cst.If) -> None:
        self._statements.append(node)

    def leave_If(self, original_node: cst.If) -> None:
        self._statements.pop()

    def visit_For(self, node: cst.For) -> None:
        self._statements.append(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._statements.pop()

    def visit_While(self, node: cst.While) -> None:
        self._statements.append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._statements.pop()

    def visit_With(self, node: cst.With) -> None:
        self._statements.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        self._statements.pop()

    def visit_Try(self, node: cst.Try) -> None:
        self._statements.append(node)

    def leave_Try(self, original_node: cst.Try) -> None:
        self._statements.pop()

    def visit_TryStar(self, node: cst.TryStar) -> None:
        self._statements.append(node)

    def leave_TryStar(self, original_node: cst.TryStar) -> None:
        self._statements.pop()

    def visit_Match(self, node: cst.Match) -> None:
        self._statements.append(node)

    def leave_Match(self, original_node: cst.Match) -> None:
        self._statements.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._statements.append(node)
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()
        self._statements.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._statements.append(node)
        self._scopes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._scopes.pop()
        self._statements.pop()

    def _bind(
        self, target: cst.BaseExpression, value: cst.BaseExpression, stmt: cst.CSTNode
    ) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
            targets = [element.value for element in target.elements]
            values = [element.value for element in value.elements]
            if len(targets) == len(values) and not any(
                isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)
            ):
                for sub_target, sub_value in zip(targets, values, strict=True):
                    self._bind(sub_target, sub_value, stmt)
            return
        name = binding_name(target)
        if name is not None and self.context.gate_caches.matches(name):
            display = self.context.module.code_for_node(target).strip()
            self.check_binding(GateCacheBinding(name, display, value, stmt, self.site()))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value, node)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, node.value, node)

    def visit_Dict(self, node: cst.Dict) -> None:
        for element in node.elements:
            if isinstance(element, cst.DictElement):
                key = literal_string(element.key)
                if key is not None and self.context.gate_caches.matches(key):
                    display = self.context.module.code_for_node(element.key)
                    self.check_binding(
                        GateCacheBinding(key, display, element.value, node, self.site())
                    )

    def visit_Call(self, node: cst.Call) -> None:
        for arg in node.args:
            if arg.keyword is not None and self.context.gate_caches.matches(arg.keyword.value):
                text = " ".join(self.context.module.code_for_node(arg.value).split())
                display = f"{arg.keyword.value}={text if len(text) <= 40 else text[:37] + '...'}"
                self.check_binding(
                    GateCacheBinding(arg.keyword.value, display, arg.value, node, self.site())
                )
        method = method_name(node)
        positional = positional_args(node)
        if method == "register_buffer" and len(positional) >= 2:
            key, value = literal_string(positional[0].value), positional[1].value
        elif (
            isinstance(node.func, cst.Name)
            and node.func.value == "setattr"
            and len(positional) == 3
        ):
            key, value = literal_string(positional[1].value), positional[2].value
        else:
            return
        if key is not None and self.context.gate_caches.matches(key):
            self.check_binding(GateCacheBinding(key, repr(key), value, node, self.site()))
