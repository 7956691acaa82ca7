"""Which string tests on a function's parameters each of its ``return`` statements runs under.

A dtype policy often branches on the ring it is asked about::

    def ring_storage_dtype(precision, ring):
        if ring == "state":
            return torch.float32
        return model_dtype(precision)

Its summary is ``["either", [float32, model_dtype(...)], ...]``; a caller that passes
``ring="gate"`` gets only the second. Each ``return`` is listed with the tests on the way to it
(``["param_is", name, [strings], holds]``: the parameter equals one of the strings, or equals
none of them; ``["param_in", name, value, holds]``: it is, or is not, in a collection the function
names, such as a module constant ``FP32_BUFFERS = frozenset({"state", "g_cache"})``, read when
the call is evaluated; ``["param_none", name, None, holds]``: it is, or is not, None): the ``if`` statements around it and the earlier ones that returned (or raised)
when their test held. A test of another form, or on a parameter the body rebinds, is left out:
the return stays possible whatever it says.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import Any

Condition = list[Any]
"""``["param_is", name, [string, ...], holds]``, ``["param_in", name, value, holds]`` or
``["param_none", name, None, holds]``."""
ValueOf = Callable[[ast.expr], Any]
"""The summary value of an expression of the function (a module constant's name)."""


def test_condition(test: ast.expr, params: set[str], value_of: ValueOf) -> Condition | None:
    """The condition ``test`` puts on ``params`` (``ring in FP32_RINGS`` of a conditional
    expression), or None when it is of another form."""
    return _Walker(params, value_of, {}).condition(test)


def negated(condition: Condition) -> Condition:
    """The condition that holds when ``condition`` does not."""
    return _negated(condition)


def return_guards(
    body: Sequence[ast.stmt], params: set[str], stored: set[str], value_of: ValueOf
) -> dict[int, list[Condition]]:
    """``id(return) -> [condition, ...]`` for every ``return`` of ``body`` (nested functions
    and classes aside), tested on ``params`` the body never rebinds (``stored``)."""
    found: dict[int, list[Condition]] = {}
    _Walker(params - stored, value_of, found).walk(list(body), [])
    return found


class _Walker:
    def __init__(
        self, params: set[str], value_of: ValueOf, found: dict[int, list[Condition]]
    ) -> None:
        self.params = params
        self.value_of = value_of
        self.found = found

    def walk(
        self, statements: list[ast.stmt], conditions: list[Condition]
    ) -> list[Condition] | None:
        """Records the returns of ``statements``; the tests that hold after them when they fall
        through, None when they always return or raise."""
        current = list(conditions)
        for statement in statements:
            if isinstance(statement, ast.Return):
                self.found[id(statement)] = list(current)
                return None
            if isinstance(statement, ast.Raise):
                return None
            if isinstance(statement, ast.If):
                test = self.condition(statement.test)
                held = [*current, test] if test is not None else current
                failed = [*current, _negated(test)] if test is not None else current
                after_body = self.walk(statement.body, held)
                after_else = self.walk(statement.orelse, failed)
                # what follows runs only on a way that falls through; on both, under what held
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
                    self.walk([s for s in inner if isinstance(s, ast.stmt)], current)
            for handler in getattr(statement, "handlers", None) or ():
                if isinstance(handler, ast.ExceptHandler):
                    self.walk(handler.body, current)
        return current

    def condition(self, test: ast.expr) -> Condition | None:
        """``ring == "state"``, ``ring in ("state", "conv")``, ``ring in FP32_RINGS``, their
        negations, or None."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.condition(test.operand)
            return None if inner is None else _negated(inner)
        if not (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.left, ast.Name)
            and test.left.id in self.params
        ):
            return None
        operator, right = test.ops[0], test.comparators[0]
        if isinstance(operator, (ast.Is, ast.IsNot)):
            if not (isinstance(right, ast.Constant) and right.value is None):
                return None
            return ["param_none", test.left.id, None, isinstance(operator, ast.Is)]
        if isinstance(operator, (ast.Eq, ast.NotEq)):
            strings = _strings([right])
            holds = isinstance(operator, ast.Eq)
        elif isinstance(operator, (ast.In, ast.NotIn)):
            holds = isinstance(operator, ast.In)
            if isinstance(right, (ast.Name, ast.Attribute)):
                # a collection of the module or of another: its strings are read at the call
                return ["param_in", test.left.id, self.value_of(right), holds]
            if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                return None
            strings = _strings(right.elts)
        else:
            return None
        return None if strings is None else ["param_is", test.left.id, strings, holds]


def _negated(condition: Condition) -> Condition:
    return [condition[0], condition[1], condition[2], not condition[3]]


def _strings(nodes: Sequence[ast.expr]) -> list[str] | None:
    values = [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return values if len(values) == len(nodes) and values else None
