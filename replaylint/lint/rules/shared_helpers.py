"""RL006's helper functions: a helper of this module called once per cache, whose dtype parameter
is the dtype of every cache it returns.

The argument the gate-cache call passes for that parameter (or the parameter's default, when the
call passes nothing) must be float32. Passing float32 is the fix only when the helper's result is
the gate cache alone and the parameter serves nothing else.
"""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.scopes import all_params
from replaylint.lint.dataflow.strings import NO_ENV, Env
from replaylint.lint.fixes.drafts import FixDraft, InsertAfter, Replace
from replaylint.lint.model import Applicability
from replaylint.lint.rules.wording import WHY
from replaylint.lint.syntax.nodes import (
    comprehension_in,
    keyword_arg,
    one_line,
    positional_args,
    read_count,
)
from replaylint.lint.syntax.sites import Site


def helper_call(value: cst.BaseExpression) -> cst.Call | None:
    """The call under moves that keep its result's dtype (``.contiguous()``, ``.cuda()``,
    ``.to(device)``): the helper call that made the gate cache, if any."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in {"contiguous", "cuda", "to"}
        and not (keyword_arg(value, "dtype") or positional_args(value)[1:])
    ):
        value = value.func.value
    return value if isinstance(value, cst.Call) else None


class LoopCall(NamedTuple):
    """A helper call that makes one cache per iteration of a loop over cache names."""

    word: str
    """``loop`` or ``comprehension``."""
    iterable: str
    env: Env
    """An iteration that makes the gate cache."""
    condition: str | None
    """The test on the loop's variable that holds for the gate cache (``name == "g_cache"``)."""


class HelperFinding(NamedTuple):
    node: cst.CSTNode
    message: str
    fix: FixDraft | None


class SharedHelpers:
    """RL006's questions about the helpers of one file."""

    def __init__(self, context: FileContext, prov: Provenance) -> None:
        self._context = context
        self._prov = prov

    def finding(
        self,
        call: cst.Call,
        subject: str,
        site: Site,
        position: int | None,
        loop: LoopCall | None = None,
    ) -> HelperFinding | None:
        """What to report for the gate cache that ``call`` (or its element ``position``) makes;
        ``loop``: the call makes one cache per iteration of a loop over cache names."""
        found = called_function(self._context.index, self._prov, call, site)
        if found is None:
            return None
        helper, helper_scopes, bound = found
        scope = self._context.scope(helper)
        parameters = [p for p in all_params(helper.params) if p.star == ""]
        if bound and parameters:
            parameters = parameters[1:]
        names = [p.name.value for p in parameters]
        for statement_return, statement in scope.returns:
            returned = statement_return.value
            if returned is None:
                continue
            if position is not None:
                comprehension = comprehension_in(returned)
                if comprehension is not None:
                    returned = comprehension.elt
                elif isinstance(returned, (cst.Tuple, cst.List)) and position < len(
                    returned.elements
                ):
                    returned = returned.elements[position].value
                else:
                    continue
            helper_site = Site(helper_scopes, statement)
            for fact in self._prov.tensor_facts(returned, helper_site):
                if fact.kind not in {Kind.VARIABLE, Kind.EXPLICIT}:
                    continue
                if any(self._context.gate_caches.matches(b.name) for b in fact.via):
                    continue  # a gate cache inside the helper: RL001/RL002 report it there
                for parameter in (d.parameter for d in fact.dtypes if d.parameter is not None):
                    if parameter in names:
                        index = names.index(parameter)
                        return self._check_argument(
                            call,
                            subject,
                            site,
                            helper,
                            (parameters[index], index),
                            fact,
                            position,
                            loop,
                        )
        return None

    def _check_argument(
        self,
        call: cst.Call,
        subject: str,
        site: Site,
        helper: cst.FunctionDef,
        parameter_at: tuple[cst.Param, int],
        fact: TensorFact,
        position: int | None,
        loop: LoopCall | None,
    ) -> HelperFinding | None:
        parameter, index = parameter_at
        name = parameter.name.value
        argument = keyword_arg(call, name)
        stars = any(arg.star for arg in call.args)
        if argument is None and not stars:
            positional = positional_args(call)
            if index < len(positional):
                argument = positional[index]
        helper_line = self._context.line_of(helper)
        allocation = one_line(
            self._context.module, fact.allocation.call if fact.allocation else fact.node
        )
        where = "" if loop is None else f" in a {loop.word} over `{loop.iterable}`"
        lead = (
            f"{subject} is allocated{where} by `{helper.name.value}` (line {helper_line}), "
            f"whose parameter `{name}` is the dtype of `{allocation}` for every cache it makes"
        )
        # Passing float32 is right only when the helper's result is the gate cache alone and the
        # parameter serves nothing else.
        torch = self._context.spelling.torch_at(site)
        single_use = position is None and read_count(helper.body, name) == 1 and torch is not None
        spelling = self._context.spelling.float32_at(site)
        imports = torch.imports if torch is not None else ()
        # safe, unless spelling float32 needs an import the module did not need before
        safe = torch is None or torch.safe
        applicability = Applicability.SAFE if safe else Applicability.UNSAFE
        if loop is not None:
            # one call for every cache: float32 only in the gate cache's iterations
            single_use = single_use and loop.condition is not None
        if argument is not None:
            facts = self._prov.dtype_facts(
                argument.value, site, NO_ENV if loop is None else loop.env
            )
            if all(f.is_float32 for f in facts):
                return None
            passed = one_line(self._context.module, argument.value)
            replacement = spelling
            if loop is not None and loop.condition is not None:
                original = one_line(self._context.module, argument.value, 10_000)
                if isinstance(argument.value, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
                    original = f"({original})"
                replacement = f"{spelling} if {loop.condition} else {original}"
            fix = (
                FixDraft(
                    f"Pass {spelling} for `{name}`",
                    (Replace(argument.value, replacement), *imports),
                    applicability,
                )
                if single_use
                else None
            )
            return HelperFinding(
                argument.value,
                f"{lead}; this call passes `{passed}`, which is not provably float32; {WHY}"
                + ("" if single_use else _why_no_fix(helper, name, position)),
                fix,
            )
        if stars or parameter.default is None or loop is not None:
            return None
        default_facts = self._prov.dtype_facts(parameter.default, Site(site.scopes[:1], None))
        if all(f.is_float32 for f in default_facts):
            return None
        fix = None
        if single_use and call.args:
            fix = FixDraft(
                f"Pass {name}={spelling}",
                (InsertAfter(call.args[-1], f", {name}={spelling}"), *imports),
                applicability,
            )
        return HelperFinding(
            call,
            f"{lead}; this call leaves it at its default "
            f"`{one_line(self._context.module, parameter.default)}`, which is not float32; {WHY}",
            fix,
        )


def _why_no_fix(helper: cst.FunctionDef, name: str, position: int | None) -> str:
    if position is not None:
        return (
            f" (`{helper.name.value}` returns several caches made with `{name}`: allocate the "
            "gate cache separately as float32)"
        )
    return (
        f" (`{helper.name.value}` also uses `{name}` for other work: give the gate cache its own "
        "float32 allocation)"
    )
