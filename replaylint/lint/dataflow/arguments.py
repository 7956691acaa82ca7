"""Which expression a call passes for one parameter: by keyword, by position, or through ``*``
and ``**``.

``decode(q, k, v, **ring_args)`` with ``ring_args = dict(d_cache=d, g_cache=g16)`` (or a dict
literal, later ``ring_args["g_cache"] = x``, ``ring_args.update(g_cache=x)``) passes ``g16``;
``decode(q, *rings)`` with ``rings = Rings(d, k, g)`` passes ``g`` when the parameter's position
is known; ``decode(..., g_cache=rings.g)`` passes ``rings.g`` as written. Each passed value comes
with the site it is evaluated at and the argument that carries it (where a finding points).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import records
from replaylint.lint.dataflow.kwargs import DtypeEntries, spreads_dtype
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.syntax.nodes import keyword_arg
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


@dataclass(frozen=True)
class PassedValue:
    value: cst.BaseExpression
    site: Site
    argument: cst.Arg
    """The argument of the call that carries the value (``g_cache=x``, ``*rings``, ``**kw``)."""


def passed_values(
    prov: Provenance, call: cst.Call, parameter: str, position: int | None, site: Site
) -> list[PassedValue]:
    """The values ``call`` may pass for ``parameter`` (at ``position`` when passed by position);
    empty when that cannot be read or nothing is passed."""
    written = keyword_arg(call, parameter)
    if written is not None:
        return [PassedValue(written.value, site, written)]
    if position is not None:
        positional = _by_position(prov, call, position, site)
        if positional is not None:
            return [positional]
    spreads = [arg for arg in call.args if arg.star == "**"]
    if not spreads:
        return []
    passed = spreads_dtype(prov, [arg.value for arg in spreads], site, NO_ENV, key=parameter)
    if not isinstance(passed, DtypeEntries):
        return []
    return [PassedValue(value, where, spreads[-1]) for value, where in passed.values]


RING_PARAMETERS = ("d_cache", "k_cache")
"""The d and k rings of sglang's signature, the two places before the gate ring's."""


def ring_arguments(
    prov: Provenance,
    call: cst.Call,
    gate_position: int | None,
    site: Site,
    defined: tuple[cst.FunctionDef, bool] | None,
) -> list[PassedValue]:
    """What ``call`` passes for the d and k rings: by keyword, by their place in the module's own
    definition of the entry point (``defined``: the function, and whether it is bound), or in
    sglang's order, the two places before the gate ring's (``gate_position``)."""
    found: list[PassedValue] = []
    for before, parameter in zip((2, 1), RING_PARAMETERS, strict=True):
        if defined is not None:
            position = parameter_position(defined[0], parameter, defined[1])
        else:
            position = None if gate_position is None else gate_position - before
        found += passed_values(prov, call, parameter, position, site)
    return found


def parameter_position(function: cst.FunctionDef, parameter: str, bound: bool) -> int | None:
    """Where ``parameter`` goes among the positional arguments of a call of ``function``."""
    ordered = [*function.params.posonly_params, *function.params.params]
    if bound:
        ordered = ordered[1:]
    names = [param.name.value for param in ordered]
    return names.index(parameter) if parameter in names else None


def _by_position(prov: Provenance, call: cst.Call, position: int, site: Site) -> PassedValue | None:
    """The value at ``position`` among the positional arguments, expanding each ``*`` whose
    elements (or only their number) are known; None past an unknown ``*`` or past the end."""
    count = 0
    for arg in call.args:
        if arg.keyword is not None or arg.star == "**":
            continue
        if arg.star == "*":
            expanded = records.elements(prov, arg.value, site, NO_ENV)
            if expanded is None:  # elements unknown, but perhaps their number
                size = records.sequence_length(prov, arg.value, site, NO_ENV)
                if size is None or position < count + size:
                    return None
                count += size
                continue
            if position < count + len(expanded):
                held = expanded[position - count]
                return PassedValue(held.value, held.site, arg)
            count += len(expanded)
            continue
        if count == position:
            return PassedValue(arg.value, site, arg)
        count += 1
    return None
