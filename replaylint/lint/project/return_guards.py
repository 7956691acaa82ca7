"""Which string tests on a function's parameters each of its ``return`` statements runs under.

A dtype policy often branches on the ring it is asked about::

    def ring_storage_dtype(precision, ring):
        if ring == "state":
            return torch.float32
        return model_dtype(precision)

Its summary is ``["either", [float32, model_dtype(...)], ...]``; a caller that passes
``ring="gate"`` gets only the second. Each ``return`` is listed with the tests on the way to it
(``["param_is", name, [strings], holds]``: the parameter equals one of the strings, or equals
none of them): the ``if`` statements around it and the earlier ones that returned (or raised)
when their test held. A test of another form, or on a parameter the body rebinds, is left out:
the return stays possible whatever it says.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

Condition = list[Any]
"""``["param_is", name, [string, ...], holds]``."""


def return_guards(
    body: Sequence[ast.stmt], params: set[str], stored: set[str]
) -> dict[int, list[Condition]]:
    """``id(return) -> [condition, ...]`` for every ``return`` of ``body`` (nested functions
    and classes aside), tested on ``params`` the body never rebinds (``stored``)."""
    found: dict[int, list[Condition]] = {}
    _walk(list(body), [], params - stored, found)
    return found


def _walk(
    statements: list[ast.stmt],
    conditions: list[Condition],
    params: set[str],
    found: dict[int, list[Condition]],
) -> list[Condition] | None:
    """Records the returns of ``statements``; the tests that hold after them when they fall
    through, None when they always return or raise."""
    current = list(conditions)
    for statement in statements:
        if isinstance(statement, ast.Return):
            found[id(statement)] = list(current)
            return None
        if isinstance(statement, ast.Raise):
            return None
        if isinstance(statement, ast.If):
            test = _condition(statement.test, params)
            held = [*current, test] if test is not None else current
            failed = [*current, _negated(test)] if test is not None else current
            after_body = _walk(statement.body, held, params, found)
            after_else = _walk(statement.orelse, failed, params, found)
            # what follows runs only on a way that falls through; on both, under what held before
            if after_body is None:
                if after_else is None:
                    return None
                current = after_else
            elif after_else is None:
                current = after_body
            continue
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                _walk([s for s in inner if isinstance(s, ast.stmt)], current, params, found)
        for handler in getattr(statement, "handlers", None) or ():
            if isinstance(handler, ast.ExceptHandler):
                _walk(handler.body, current, params, found)
    return current


def _negated(condition: Condition) -> Condition:
    return [condition[0], condition[1], condition[2], not condition[3]]


def _condition(test: ast.expr, params: set[str]) -> Condition | None:
    """``ring == "state"``, ``ring in ("state", "conv")``, their negations, or None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _condition(test.operand, params)
        return None if inner is None else _negated(inner)
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, ast.Name)
        and test.left.id in params
    ):
        return None
    operator, right = test.ops[0], test.comparators[0]
    if isinstance(operator, (ast.Eq, ast.NotEq)):
        strings = _strings([right])
        holds = isinstance(operator, ast.Eq)
    elif isinstance(operator, (ast.In, ast.NotIn)) and isinstance(
        right, (ast.Tuple, ast.List, ast.Set)
    ):
        strings = _strings(right.elts)
        holds = isinstance(operator, ast.In)
    else:
        return None
    return None if strings is None else ["param_is", test.left.id, strings, holds]


def _strings(nodes: Sequence[ast.expr]) -> list[str] | None:
    values = [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return values if len(values) == len(nodes) and values else None
