"""What a loop over cache names gives the gate cache, in words, and where that is written: one
dtype, cast or load shared by every cache; a dtype picked by the cache's name (``dtypes[name]``);
or a choice that keeps other caches float32 and leaves the gate cache out
(``ring_dtype = torch.float32 if name == "state" else dtype``), reported where it is made. And
the fix of a tensor made before the loop that becomes the gate cache in it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.strings import Iteration
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.model import Applicability
from replaylint.lint.rules.wording import quoted
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

__all__ = [
    "LoopTreatment",
    "before_loop_fix",
    "loop_treatment",
    "shared_treatment",
    "telling_variable",
]


@dataclass(frozen=True)
class LoopTreatment:
    words: str
    """``that gives every cache the same dtype, torch.bfloat16`` and the like."""
    where: cst.CSTNode | None
    """Where the choice that leaves the gate cache out is written; None: at the tensor."""


def loop_treatment(
    prov: Provenance,
    module: cst.Module,
    fact: TensorFact,
    variable: str | None,
    loop: cst.CSTNode,
    site: Site,
) -> LoopTreatment:
    """What the loop ``loop`` over cache names (its variable ``variable``, None when it has no
    one name) gives the gate cache ``fact`` describes, at ``site``."""
    exemption = _exemption(prov, fact, variable, loop, site)
    if exemption is not None:
        picked = one_line(module, exemption)
        return LoopTreatment(
            f"whose dtype `{picked}` keeps other caches float32, not this one", exemption
        )
    if fact.kind is Kind.LOADED:
        return LoopTreatment(f"that keeps it in the dtype it was saved with ({fact.detail})", None)
    if (
        variable is not None
        and fact.kind in {Kind.EXPLICIT, Kind.VARIABLE}
        and _reads(fact.node, variable)
    ):
        # `dtype=dtypes[name]`: each cache its own dtype, the gate cache a non-float32 one
        return LoopTreatment(f"that gives it {_dtype(module, fact)}", None)
    return LoopTreatment(f"that gives every cache {shared_treatment(module, fact)}", None)


def shared_treatment(module: cst.Module, fact: TensorFact) -> str:
    """What a loop over cache names gives every cache, the gate cache included."""
    if fact.kind is Kind.INHERITED:
        return f"the same inherited dtype ({fact.detail})"
    if fact.kind is Kind.CAST:
        return f"the same cast ({fact.detail})"
    if fact.kind is Kind.LOADED:
        return f"the dtype it was saved with, uncast ({fact.detail})"
    literals = fact.non_float32_literals
    if literals:
        return f"the same dtype, {' or '.join(f'torch.{d}' for d in literals)}"
    return f"the same dtype `{one_line(module, fact.node)}`, which is not provably float32"


def _dtype(module: cst.Module, fact: TensorFact) -> str:
    picked = one_line(module, fact.node)
    literals = fact.non_float32_literals
    if literals:
        return f"{' or '.join(f'torch.{d}' for d in literals)} (`{picked}`)"
    return f"`{picked}`, which is not provably float32"


def _exemption(
    prov: Provenance, fact: TensorFact, variable: str | None, loop: cst.CSTNode, site: Site
) -> cst.IfExp | None:
    """``ring_dtype = torch.float32 if name in self.fp32_rings else dtype`` in the loop: the
    choice by the loop's variable that leaves the gate cache out."""
    if variable is None or not isinstance(fact.node, cst.Name):
        return None
    found = prov.lookup(fact.node.value, site)
    if not found or len(found) != 1:
        return None
    binding = found[0][0]
    value = binding.value
    if not (
        binding.kind == "assign"
        and isinstance(value, cst.IfExp)
        and prov.within(binding.node, loop)
        and _reads(value.test, variable)
    ):
        return None
    return value


def _reads(node: cst.CSTNode, variable: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == variable for n in descendants(node))


def before_loop_fix(
    context: FileContext,
    fact: TensorFact,
    key: cst.BaseExpression,
    value: cst.BaseExpression,
    loop: cst.CSTNode,
    iterations: Sequence[Iteration],
    site: Site,
) -> FixDraft | None:
    """Float32 where a tensor made before the loop becomes the gate cache in it, as in
    ``for name, t in zip(RINGS, (d, k, g))``: only when no other cache of the loop is that
    tensor and the names it passes through are read nowhere else."""
    prov = context.provenance
    for env in iterations:
        name = prov.string_value(key, site, env)
        if name is not None and context.gate_caches.matches(name):
            continue
        if any(other.node is fact.node for other in prov.tensor_facts(value, site, env)):
            return None  # the same tensor is another cache too
    loop_names = {id(b.node) for b in fact.via if prov.within(b.node, loop)}
    if not all(context.index.read_once(b) for b in fact.via if id(b.node) not in loop_names):
        return None
    made = None if fact.target is None else context.spelling.edits_for(fact.target, site)
    if made is None:
        return None
    edits, safe = made
    applicability = Applicability.SAFE if safe else Applicability.UNSAFE
    return FixDraft(f"Allocate it as {context.spelling.float32_at(site)}", edits, applicability)


def gate_name_test(variable: str | None, envs: Sequence[Iteration]) -> str | None:
    """``name == "g_cache"`` (or ``name in (...)``): the test on the loop's naming variable
    that holds for the gate-cache iterations ``envs``; None without such a variable."""
    if variable is None:
        return None
    values = sorted({str(env[variable]) for env in envs})
    if len(values) == 1:
        return f"{variable} == {quoted(values[0])}"
    return f"{variable} in ({', '.join(quoted(v) for v in values)})"


def telling_variable(
    gate_envs: list[tuple[str, Iteration]], iterations: Sequence[Iteration]
) -> str | None:
    """A loop variable that holds a string in every iteration and tells the gate cache's
    iterations from the others (``kind`` beside the ring it names)."""
    gate_ids = {id(env) for _, env in gate_envs}
    for variable in sorted({v for env in iterations for v in env}):
        if not all(isinstance(env.get(variable), str) for env in iterations):
            continue
        gate_values = {env[variable] for env in iterations if id(env) in gate_ids}
        other_values = {env[variable] for env in iterations if id(env) not in gate_ids}
        if gate_values.isdisjoint(other_values):
            return variable
    return None


def got_by_name(
    provenance: Provenance, holder: cst.BaseExpression, loops: Sequence[cst.CSTNode], site: Site
) -> cst.BaseExpression | None:
    """``name`` when ``holder`` is a local bound only to ``getattr(obj, name)`` inside one of
    ``loops`` (``rings = getattr(self, name)`` in a loop over ring names)."""
    if not isinstance(holder, cst.Name) or not loops:
        return None
    found = provenance.lookup(holder.value, site)
    if found is None or len(found) != 1:
        return None
    value = found[0][0].value
    return None if value is None else _name_got_in(provenance, value, loops)


def _name_got_in(
    provenance: Provenance, value: cst.BaseExpression, loops: Sequence[cst.CSTNode]
) -> cst.BaseExpression | None:
    """``name`` when ``value`` is ``getattr(obj, name)`` written inside one of ``loops``."""
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value == "getattr"
        and len(value.args) == 2
        and any(provenance.within(value, loop) for loop in loops)
    ):
        return value.args[1].value
    return None


def ring_taken_by_name(
    provenance: Provenance, value: cst.BaseExpression, loops: Sequence[cst.CSTNode], site: Site
) -> cst.BaseExpression | None:
    """``name`` when ``value`` is made from ``getattr(obj, name)`` by method calls
    (``getattr(pool, name).cpu().half()``), directly or through a local bound to it in one of
    ``loops`` (``ring = getattr(pool, name)``)."""
    inner = value
    while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute):
        inner = inner.func.value
    if (name := _name_got_in(provenance, inner, loops)) is not None:
        return name
    if inner is value:
        return None  # a plain name: what the list is handed is not a cast of a ring
    return got_by_name(provenance, inner, loops, site)
