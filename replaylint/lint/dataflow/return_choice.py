"""Which returns of another module's function a call may reach: the guards its summary
records for each ``return`` (:mod:`replaylint.lint.project.return_guards`) decided by the
arguments the call binds. A string parameter tested against literals or a named collection
(``if name in FULL_PRECISION_BUFFERS``), a parameter tested against None (``if dtype is None``);
a guard the call does not decide keeps its return possible."""

from __future__ import annotations

from typing import Any

import libcst as cst

from replaylint.lint.dataflow.imported import Context, Evaluation, There, Unknown
from replaylint.lint.dataflow.summary_values import Here
from replaylint.lint.project.index import Found
from replaylint.lint.project.summaries import Value

__all__ = ["possible"]


def possible(evaluation: Evaluation, either: Value, context: Context) -> list[Value]:
    """The branches of ``either`` that may be returned: a return guarded by a test on a
    string parameter (``if ring == "state": return torch.float32``) that the call decides
    false is not."""
    if len(either) < 4:
        return list(either[1])
    kept = [
        branch
        for branch, alternatives in zip(either[1], either[3], strict=True)
        if any(all(_may_hold(evaluation, c, context) for c in guard) for guard in alternatives)
    ]
    return kept or list(either[1])


def _may_hold(evaluation: Evaluation, condition: list[Any], context: Context) -> bool:
    """Whether ``["param_is", name, strings, holds]`` (or ``["param_in", name, collection,
    holds]``) may hold for the arguments bound."""
    if str(condition[1]) not in context.params:
        return True
    if condition[0] == "param_none":
        passed_none = _is_none(evaluation, context.params[str(condition[1])])
        return True if passed_none is None else passed_none is bool(condition[3])
    if condition[0] not in {"param_is", "param_in"}:
        return True
    try:
        passed = evaluation.string(["param", condition[1]], context)
        strings = (
            condition[2]
            if condition[0] == "param_is"
            else _strings(evaluation, condition[2], context)
        )
    except Unknown:
        return True
    return (passed in strings) is bool(condition[3])


def _is_none(evaluation: Evaluation, bound: Here | There) -> bool | None:
    """Whether an argument (or default) is None: a literal says, a dtype says no; None when
    it is not known."""
    if isinstance(bound, There):
        value = bound.value
        return value[1] is None if value[0] == "const" else None
    expr = bound.expr
    if isinstance(expr, cst.Name) and expr.value == "None":
        return True
    if isinstance(expr, (cst.SimpleString, cst.Integer, cst.Float)):
        return False
    facts = evaluation.prov.dtype_facts(expr, bound.site, bound.env)
    return False if facts and all(f.dtype is not None for f in facts) else None


def _strings(evaluation: Evaluation, value: Value, context: Context) -> list[str | int]:
    """The strings of a literal collection a project value denotes: ``("state", "g")``,
    ``frozenset({...})`` or a module constant bound to one; raises :class:`Unknown`."""
    evaluation.step()
    kind = value[0]
    if kind in {"tuple", "set"}:
        return [evaluation.string(element, context) for element in value[1]]
    if (
        kind == "call"
        and value[1] in (["name", "frozenset"], ["name", "set"], ["name", "tuple"])
        and len(value[2]) == 1
        and not value[3]
    ):
        return _strings(evaluation, value[2][0], context)
    if kind in {"name", "ref", "attr"}:
        target = evaluation.target(value, context)
        if isinstance(target, Found) and target.definition[0] == "value":
            inner = Context(target.module, origins=target.origins)
            return _strings(evaluation, target.definition[2], inner)
    raise Unknown
