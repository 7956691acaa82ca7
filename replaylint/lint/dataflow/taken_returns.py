"""The ``return`` statements a call of a helper of the module can reach, with its parameters
bound to the call's arguments or defaults::

    def to_engine_layout(tensor, engine_dtype=None):
        if engine_dtype is None:
            return tensor.clone()
        return tensor.to(dtype=engine_dtype)

``to_engine_layout(ring)`` returns the clone: the first ``return`` runs under a test the call
makes true, so the second is never reached; ``to_engine_layout(ring, torch.bfloat16)`` returns
the cast, the first ``return``'s test being false. A test the call does not decide
(:func:`replaylint.lint.dataflow.conditions.condition`) keeps every return possible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.conditions import condition
from replaylint.lint.dataflow.scopes import Guard, Scope
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.syntax.sites import ScopeNode, Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["taken_returns"]


def taken_returns(
    prov: Provenance, scope: Scope, scopes: tuple[ScopeNode, ...], env: Env
) -> list[tuple[cst.Return, cst.CSTNode]]:
    """The returns of ``scope`` (a function's, ``scopes`` leading to it) with a value that a call
    binding ``env`` may reach."""
    returns = [(r, statement) for r, statement in scope.returns if r.value is not None]
    if not env:
        return returns
    placed = [
        (r, statement, *scope.statements.get(id(statement), (0, ()))) for r, statement in returns
    ]

    decided: dict[tuple[int, int], bool | None] = {}  # each guard at each return, asked once

    def holds(guard: Guard, statement: cst.CSTNode) -> bool | None:
        if guard.test is None:
            return None
        key = (id(guard), id(statement))
        if key not in decided:
            value = condition(prov, guard.test, Site(scopes, statement), env)
            decided[key] = None if value is None else value is guard.polarity
        return decided[key]

    kept: list[tuple[cst.Return, cst.CSTNode]] = []
    for node, statement, order, guards in placed:
        if any(holds(g, statement) is False for g in guards):
            continue  # under a test the call makes false
        if any(
            earlier < order
            and tuple(before[: len(guards)]) == tuple(guards)
            and all(holds(g, other) is True for g in before[len(guards) :])
            for _, other, earlier, before in placed
        ):
            continue  # an earlier return in the same block, under tests the call makes true
        kept.append((node, statement))
    return kept or returns
