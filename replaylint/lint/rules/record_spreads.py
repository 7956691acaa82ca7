"""RL006's records filled from one comprehension: ``Rings(*(torch.zeros(s, dtype=dtype) for s in
shapes))`` gives every field it fills, the gate cache's among them, the same dtype.

The fields a ``*`` argument fills follow from the record's positional fields (a NamedTuple or
dataclass of the module or of another module of the project): as many as the comprehension has
iterations, when that is known, or else every field up to the positional arguments after it,
when none of those has a default. When the comprehension is written in the call, the fix
numbers its loop (:mod:`replaylint.lint.fixes.positional`): ``*(E for t in S)`` becomes
``*(E' for position, t in enumerate(S))``, where ``E'`` picks float32 when ``position`` is the
gate cache's field's. ``S`` is read once, as before, and may be any iterable.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.records import positional_fields, sequence_length
from replaylint.lint.dataflow.strings import NO_ENV, numbered_iteration
from replaylint.lint.fixes.positional import positional_fix
from replaylint.lint.rules.loop_treatment import shared_treatment
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.wording import WHY, named_gate_cache
from replaylint.lint.syntax.nodes import Comprehension, comprehension_in, one_line
from replaylint.lint.syntax.sites import Site

_REPORTED = frozenset({Kind.EXPLICIT, Kind.VARIABLE, Kind.INHERITED, Kind.CAST, Kind.LOADED})


def spread_record_findings(
    context: FileContext, prov: Provenance, call: cst.Call, site: Site
) -> list[HelperFinding]:
    """What to report for ``call``, when it fills a record's gate-cache field from a ``*``
    comprehension shared with other fields."""
    stars = [i for i, arg in enumerate(call.args) if arg.star == "*"]
    if len(stars) != 1 or any(arg.star == "**" for arg in call.args):
        return []
    star = stars[0]
    named = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    if any(arg.keyword is not None for arg in call.args[:star]):
        return []
    comprehension, site = _comprehension(prov, call.args[star].value, site)
    if comprehension is None or not isinstance(comprehension.elt, (cst.Call, cst.IfExp)):
        return []
    loop = comprehension.for_in
    if loop.ifs or loop.inner_for_in is not None:
        return []
    fields = positional_fields(prov, call, site)
    if fields is None:
        return []
    fields = [field for field in fields if field[0] not in named]  # keywords fill their own
    length = sequence_length(prov, comprehension, site, NO_ENV)
    after = len([arg for arg in call.args[star + 1 :] if arg.keyword is None])
    if length is None:
        filled = fields[star : len(fields) - after]
        if any(has_default for _, has_default in filled):
            return []  # which fields the spread reaches depends on its length
    else:
        filled = fields[star : star + length]
    gates = [(j, name) for j, (name, _) in enumerate(filled) if context.gate_caches.matches(name)]
    if not gates or len(filled) < 2:
        return []
    iterations = prov.iterations(loop.target, loop.iter, site)
    found: list[HelperFinding] = []
    for offset, name in gates:
        env = (
            iterations[offset]
            if iterations and len(iterations) == len(filled)
            else numbered_iteration(loop, offset, site)
        )
        for fact in prov.tensor_facts(comprehension.elt, site, env):
            if fact.kind not in _REPORTED:
                continue
            record = one_line(context.module, call.func)
            subject = named_gate_cache(context.gate_caches, name, f"{record}.{name}")
            written = call.args[star].value is comprehension
            found.append(
                HelperFinding(
                    comprehension,
                    f"{subject} is filled from one comprehension that gives every field of "
                    f"`{record}` it fills {shared_treatment(context.module, fact)}; give the gate "
                    f"cache's field its own float32 value ({WHY})",
                    positional_fix(
                        context.module, context.spelling.torch_at(site), comprehension, offset, fact
                    )
                    if written
                    else None,
                )
            )
            break
    return found[:1]


def _comprehension(
    prov: Provenance, spread: cst.BaseExpression, site: Site
) -> tuple[Comprehension | None, Site]:
    """The comprehension ``*spread`` unpacks: written there, or bound once to the local it
    names (``tensors = (torch.zeros(s, dtype=dtype) for s in shapes)``), with its site."""
    written = comprehension_in(spread)
    if written is not None or not isinstance(spread, cst.Name):
        return written, site
    found = prov.lookup(spread.value, site) or []
    if len(found) != 1 or found[0][0].kind != "assign" or found[0][0].value is None:
        return None, site
    binding, at = found[0]
    assert binding.value is not None
    return comprehension_in(binding.value), at
