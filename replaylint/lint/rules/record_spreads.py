"""RL006's records filled from one comprehension: ``Rings(*(torch.zeros(s, dtype=dtype) for s in
shapes))`` gives every field it fills, the gate cache's among them, the same dtype.

The fields a ``*`` argument fills follow from the record's positional fields (a NamedTuple or
dataclass of the module or of another module of the project): as many as the comprehension has
iterations, when that is known, or else every field up to the positional arguments after it,
when none of those has a default. The unsafe fix splits the spread around the gate cache's
field when the comprehension is written in the call and loops a plain name over a sequence of
known length: ``*(E for t in S)`` becomes ``*(*(E for t in S[:j]), E', *(E for t in S[j + 1:]))``,
where ``E'`` is the element for ``S[j]`` made float32. Unsafe: ``S`` must be a sequence (a
tuple, a list, a NamedTuple), and it is read three times.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import AddDtypeArgument, Kind, SetDtype, TensorFact
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.records import positional_fields, sequence_length
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.fixes.drafts import AddModuleImport, EditDraft, FixDraft, Replace
from replaylint.lint.model import Applicability
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
    if comprehension is None or not isinstance(comprehension.elt, cst.Call):
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
        env = iterations[offset] if iterations and len(iterations) == len(filled) else NO_ENV
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
                    _split_fix(context, comprehension, (offset, len(filled)), fact, site)
                    if written
                    else None,
                )
            )
            break
    return found[:1]


def _split_fix(
    context: FileContext,
    comprehension: Comprehension,
    place: tuple[int, int],
    fact: TensorFact,
    site: Site,
) -> FixDraft | None:
    """The spread split around the gate cache's field, the ``place[0]``-th of the ``place[1]``
    it fills (see the module docstring)."""
    offset, count = place
    loop = comprehension.for_in
    if not isinstance(loop.target, cst.Name) or not isinstance(
        loop.iter, (cst.Name, cst.Attribute)
    ):
        return None
    module = context.module
    source, variable = one_line(module, loop.iter), loop.target.value
    torch = context.spelling.torch_at(site)
    float32 = torch.attribute("float32") if torch is not None else "torch.float32"
    element = _float32_element(comprehension.elt, fact, variable, f"{source}[{offset}]", float32)
    if element is None:
        return None
    code = module.code_for_node(comprehension.elt)
    parts = [f"*({code} for {variable} in {source}[:{offset}])"] if offset else []
    parts.append(element)
    if offset + 1 < count:
        parts.append(f"*({code} for {variable} in {source}[{offset + 1}:])")
    # a generator's range leaves out its parentheses, which then hold the new tuple display;
    # a list comprehension's brackets are in its range and go with it
    text = ", ".join(parts)
    if not isinstance(comprehension, cst.GeneratorExp) or not comprehension.lpar:
        text = f"({text})"
    edits: list[EditDraft] = [Replace(comprehension, text)]
    if torch is None:
        edits.append(AddModuleImport("torch"))
    return FixDraft(
        f"Give the gate cache's field its own {float32} value", tuple(edits), Applicability.UNSAFE
    )


def _float32_element(
    element: cst.BaseExpression, fact: TensorFact, variable: str, item: str, float32: str
) -> str | None:
    """``element`` for the item ``item`` (the loop's ``variable`` replaced) made float32, as
    code; None for a way of making it float32 this cannot write."""
    target = fact.target
    if isinstance(target, SetDtype):
        changed = _Rewrite(variable, item, target.node, cst.parse_expression(float32))
    elif isinstance(target, AddDtypeArgument):
        changed = _Rewrite(variable, item, target.node, None, float32)
    else:
        return None
    rewritten = element.visit(changed)
    if not changed.done or not isinstance(rewritten, cst.BaseExpression):
        return None
    return cst.Module([]).code_for_node(rewritten)


class _Rewrite(cst.CSTTransformer):
    """The loop variable replaced by one item, and the dtype made float32 where ``node`` is."""

    def __init__(
        self,
        variable: str,
        item: str,
        node: cst.CSTNode,
        new: cst.BaseExpression | None,
        added: str | None = None,
    ) -> None:
        self._variable, self._item, self._node, self._new, self._added = (
            variable,
            item,
            node,
            new,
            added,
        )
        self.done = False

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node is self._node and self._new is not None:
            self.done = True
            return self._new
        if original_node.value == self._variable:
            return cst.parse_expression(self._item)
        return updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if original_node is self._node and self._new is not None:
            self.done = True
            return self._new
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node is self._node and self._added is not None:
            self.done = True
            dtype = cst.Arg(
                keyword=cst.Name("dtype"),
                value=cst.parse_expression(self._added),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
            return updated_node.with_changes(args=[*updated_node.args, dtype])
        return updated_node


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
