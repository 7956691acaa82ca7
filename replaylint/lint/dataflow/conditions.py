"""Conditions a loop or a call decides: ``if name == "g_cache":`` in a loop over names,
``if to_dtype:`` in a helper evaluated for a call that passes ``to_dtype=False``.

A test is decided only from what ``env`` binds (loop variables, a helper's parameters bound to a
call's arguments or defaults) and literals; anything else leaves it undecided (None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.strings import Bound, Env, string_options, string_value
from replaylint.lint.syntax.nodes import is_none_literal, positional_args
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def condition(prov: Provenance, test: cst.BaseExpression, site: Site, env: Env) -> bool | None:
    """The value of a condition on loop-variable strings, when it is decided by ``env``."""
    if not env or not prov.enter():
        return None
    try:
        return _condition(prov, test, site, env)
    finally:
        prov.leave()


def leaves_out(
    prov: Provenance, tests: list[tuple[cst.BaseExpression, bool]], site: Site, env: Env
) -> bool:
    """Whether one of ``tests`` (each with the branch that holds the code: see
    :func:`~replaylint.lint.syntax.traversal.branch_tests`) is decided against it by ``env``."""
    return any(condition(prov, test, site, env) is (not in_branch) for test, in_branch in tests)


def _condition(prov: Provenance, test: cst.BaseExpression, site: Site, env: Env) -> bool | None:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = condition(prov, test.expression, site, env)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        first = condition(prov, test.left, site, env)
        second = condition(prov, test.right, site, env)
        if isinstance(test.operator, cst.And):
            if first is False or second is False:
                return False
            return True if first and second else None
        if first is True or second is True:
            return True
        return False if first is False and second is False else None
    flag = _flag(prov, test, site, env)
    if flag is not None:  # `keep = name in FP32_KEYS or ...` tested as `if keep`
        return condition(prov, flag[0], flag[1], env)
    constant = _constant(prov, test, env)
    if isinstance(constant, bool):  # `if to_dtype:` of a call passing `to_dtype=False`
        return constant
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        operator = comparison.operator
        if isinstance(operator, (cst.Is, cst.IsNot)) and is_none_literal(comparison.comparator):
            held = _constant(prov, test.left, env)
            if held is _NOT_CONSTANT:
                return None
            return (held is None) is isinstance(operator, cst.Is)
        left = string_value(prov, test.left, site, env)
        if isinstance(operator, (cst.In, cst.NotIn)):
            if left is None:
                return None
            options = string_options(prov, comparison.comparator, site, env)
            if options is None:
                right = string_value(prov, comparison.comparator, site, env)
                if right is None:
                    return None
                contained = left in right
            else:
                contained = left in options
            return contained if isinstance(operator, cst.In) else not contained
        numbers = (_integer(prov, test.left, env), _integer(prov, comparison.comparator, env))
        if None not in numbers and isinstance(operator, (cst.Equal, cst.NotEqual)):
            # `position == 2` of `for position, t in enumerate(rings)`
            return (numbers[0] == numbers[1]) is isinstance(operator, cst.Equal)
        right = string_value(prov, comparison.comparator, site, env)
        if left is None or right is None:
            return None
        if isinstance(operator, cst.Equal):
            return left == right
        if isinstance(operator, cst.NotEqual):
            return left != right
        return None
    if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute):
        method = test.func.attr.value
        args = positional_args(test)
        if method in {"startswith", "endswith"} and len(args) == 1:
            subject = string_value(prov, test.func.value, site, env)
            options = string_options(prov, args[0].value, site, env)
            if options is None:
                single = string_value(prov, args[0].value, site, env)
                options = None if single is None else (single,)
            if subject is None or options is None:
                return None
            check = subject.startswith if method == "startswith" else subject.endswith
            return check(tuple(options))
    return None


def _flag(
    prov: Provenance, test: cst.BaseExpression, site: Site, env: Env
) -> tuple[cst.BaseExpression, Site] | None:
    """The test a local flag was set to, when ``test`` is a name bound once to a comparison or a
    boolean expression or a test call (``keep = name in FP32_KEYS or not t.is_floating_point()``,
    ``exact = name.endswith("state")``)."""
    if not isinstance(test, cst.Name) or test.value in env:
        return None
    found = prov.lookup(test.value, site)
    if not found or len(found) != 1:
        return None
    binding, binding_site = found[0]
    value = binding.value
    if binding.kind != "assign" or not isinstance(
        value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation, cst.Call)
    ):
        return None
    return value, binding_site


_NOT_CONSTANT = object()
_CONSTANTS: dict[str, object] = {"True": True, "False": False, "None": None}


def _constant(prov: Provenance, expr: cst.BaseExpression, env: Env) -> object:
    """``True``, ``False`` or ``None`` when ``expr`` is that literal or a name the call binds to
    one (a parameter of a helper evaluated for a call passing ``to_dtype=False``); a string or
    number literal so bound is itself; anything else is ``_NOT_CONSTANT``."""
    if isinstance(expr, cst.Name) and isinstance(value := env.get(expr.value), Bound):
        if not prov.enter():
            return _NOT_CONSTANT
        try:
            return _constant(prov, value.expr, value.env(env))
        finally:
            prov.leave()
    if isinstance(expr, cst.Name) and expr.value in _CONSTANTS and expr.value not in env:
        return _CONSTANTS[expr.value]
    if isinstance(expr, (cst.SimpleString, cst.Integer, cst.Float)):
        return expr.evaluated_value
    return _NOT_CONSTANT


def _integer(prov: Provenance, expr: cst.BaseExpression, env: Env) -> int | None:
    """The integer literal ``expr`` is, or that a loop variable holds in this iteration."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.Name) and isinstance(value := env.get(expr.value), Bound):
        if not prov.enter():
            return None
        try:
            return _integer(prov, value.expr, value.env(env))
        finally:
            prov.leave()
    return None
