"""RL006: one dtype shared by several caches, the gate cache among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.dtype_tables import looked_up_by
from replaylint.lint.dataflow.facts import Kind, TensorFact
from replaylint.lint.dataflow.ring_keys import keyed_ring
from replaylint.lint.dataflow.snapshots import filled_local, only_saved
from replaylint.lint.dataflow.strings import (
    Iteration,
    naming_variable,
    numbered_iteration,
    trailing_iterations,
)
from replaylint.lint.fixes.conditional import conditional_fix
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.fixes.positional import positional_fix
from replaylint.lint.fixes.reallocation import reallocates, reallocation_fix
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Rule
from replaylint.lint.rules.buffer_loops import casts_a_module
from replaylint.lint.rules.declared_settings import declared_setting, keyword_only_setting
from replaylint.lint.rules.dtype_comprehensions import dtype_table_finding
from replaylint.lint.rules.fromkeys_tables import (
    FROMKEYS_INVALID,
    FROMKEYS_VALID,
    fromkeys_table_findings,
    shared_by_a_table,
)
from replaylint.lint.rules.keyed_helpers import keyed_helper_finding
from replaylint.lint.rules.loop_names import LoopNames
from replaylint.lint.rules.loop_treatment import (
    before_loop_fix,
    gate_name_test,
    got_by_name,
    loop_treatment,
    ring_taken_by_name,
    shared_treatment,
    telling_variable,
)
from replaylint.lint.rules.own_dtype_examples import OWN_DTYPE_VALID
from replaylint.lint.rules.read_keys import read_key_finding
from replaylint.lint.rules.record_spreads import spread_record_findings
from replaylint.lint.rules.shared_dtype_examples import SHARED_DTYPE_INVALID, SHARED_DTYPE_VALID
from replaylint.lint.rules.shared_helpers import LoopCall, SharedHelpers, helper_call
from replaylint.lint.rules.tested_keys import TESTED_INVALID, TESTED_VALID, tested_iterations
from replaylint.lint.rules.tree_map_casts import tree_map_finding
from replaylint.lint.rules.unlisted_keys import (
    UNLISTED_INVALID,
    UNLISTED_VALID,
    spread_iterations,
    unlisted_iterations,
)
from replaylint.lint.rules.wording import WHY, made_how, named_gate_cache
from replaylint.lint.syntax.nodes import (
    Comprehension,
    binding_name,
    comprehension_in,
    getattr_name,
    method_name,
    one_line,
    positional_args,
)
from replaylint.lint.syntax.sites import Site

_REPORTED = frozenset({Kind.EXPLICIT, Kind.VARIABLE, Kind.INHERITED, Kind.CAST, Kind.LOADED})


@dataclass
class _Loop:
    node: cst.CSTNode  # the `for` statement or the comprehension
    target: cst.BaseExpression
    iterable: cst.BaseExpression
    site: Site
    word: str = "loop"
    ifs: Sequence[cst.CompIf] = ()
    _iterations: list[Iteration] | None = None
    _computed: bool = False
    partial: bool = False
    """Only some iterations are known (the others' caches are not)."""


class SharedCacheDtype(Rule):
    SUMMARY = (
        "Several caches, the gate cache among them, are allocated with one shared dtype "
        "(a loop, a comprehension or a helper function)."
    )
    RATIONALE = """\
The three ReplaySSM rings look alike — `[slots, heads, L, dim]` per layer — so they are often
allocated together: a loop over `("d_cache", "k_cache", "g_cache")`, a dict comprehension, or a
helper `_ring(shape, dtype)` called three times. The d and k rings follow the model dtype; the
gate ring holds log-decays whose prefix sums the kernel exponentiates (`exp(G_T - G_j)`), where a
bf16 rounding error becomes a ~1.5% relative error in the decays at ring length 16, compounded at
every flush into the checkpoint. One shared dtype therefore makes the gate ring wrong whenever the
model is not float32, and no single line looks wrong.

The rule evaluates the loop body or comprehension once per iteration whose name is a gate cache
(`setattr(self, name, ...)`, `self.register_buffer(name, ...)`, `caches[name] = ...`,
`{name: ... for name in ...}`, f-string names such as `f"{kind}_cache"` included, a key of one
ring's layer such as `f"{name}/{layer}"` or `f"state.{name}.{layer}"` naming the ring, and the
per-layer list `rings = getattr(self, name)` that the loop appends to or whose entries it
replaces, `rings[i] = grown`, and a list handed each ring cast in turn,
`copies.append(getattr(pool, name).half())`), deciding
conditions on the name statically, so `dtype=torch.float32 if name == "g_cache" else dtype` is
clean; a ring the loop loads (`setattr(cache, name, snapshot[name])`) keeps its saved dtype. For a helper defined in the same module (a function or a method called on `self`), it
follows the helper's dtype parameter to the allocation the helper returns and checks the argument
the gate-cache call passes, also when one call in a loop over cache names makes every cache
(`caches[name] = _alloc(shape, dtype)`). A helper imported from another module of the project is RL001's or
RL002's: the argument the gate-cache call passes is followed into the helper's allocation there.
A helper that allocates one tensor per key of the mapping it is given, all in one dtype
(`{name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}` or `dict(zip(shapes,
...))`, defined in this module or another module of the project), is reported at each call whose mapping has a gate-cache
key (a literal, `{**shapes, "g_cache": shape}`, a local or attribute bound to one, a function or
method of the module returning one). So is a record whose fields, the gate cache's among them, are
filled from one `*` comprehension (`Rings(*(torch.zeros(s, dtype=dtype) for s in shapes))`,
or `Rings(*parts, pos=pos)` with `parts` bound to one; keywords fill their own fields). A dtype
table made by `dict.fromkeys(RINGS, dtype)` (or spread into a dict literal,
`{**dict.fromkeys(RINGS, dtype), "write_pos": torch.int32}`) whose names include a gate cache's is
reported at its value, once, unless a later key or a write of the gate entry in the same scope sets
it apart; the loops that allocate from it are not reported again. A library map that casts every
tensor of a container whose keys include a gate cache's (`tree_map(lambda t: t.to(dtype),
self.rings)`, Lightning's `apply_to_collection`, optree's and dm-tree's maps) is reported at the
cast, unless the function it applies chooses by the tensor's dtype.
"""
    FIX = """\
Where it is unambiguous. In a loop or comprehension, the dtype becomes `torch.float32 if name ==
"g_cache" else <the shared dtype>` (`None` when there was none keeps the others' behaviour), and a
load becomes `x.to(torch.float32) if name == "g_cache" else x` and a cast method `x.half()`
becomes `x.float() if name == "g_cache" else x.half()`. A tensor made before the loop and paired
with the gate cache's name (`zip(RINGS, (d, k, g))`) is allocated as float32 where it is made,
when no other cache is that tensor and it is read nowhere else. For a helper, the
gate-cache call passes `torch.float32` for the helper's dtype parameter, when that parameter serves
only the allocation the helper returns (in a loop, `torch.float32 if name == "g_cache" else
<the argument>`). A comprehension whose elements are taken by position
(unpacked into `d, k, g = ...`, or spread into a record's fields) gets its loop numbered:
`(t.to(torch.float32 if position == 2 else dtype) for position, t in enumerate(rings))`, the
iterable read once as before. The fix is **safe**: every other cache keeps exactly the
dtype expression it had, and only the gate cache changes, to float32. A call of a per-key
helper (which other callers may use for caches that are not gate caches, so it is left as it
is) that passes the dtype spreads a second call that makes the gate entry again:
`{**alloc_rings(shapes, dtype), **alloc_rings({"g_cache": shapes["g_cache"]}, torch.float32)}`,
every key in its place (**unsafe**: the gate ring is allocated twice for a moment). Otherwise —
a cast with arguments in a loop, a helper that also uses its dtype for other work — the finding
says what to change and has no fix, with one exception: a gate cache
unpacked from a comprehension of fresh `torch.zeros`/`ones`/`empty` (only `size`, `dtype` and
`device` given) is made again on the next line,
`g_cache = torch.zeros_like(g_cache, dtype=torch.float32)`: same shape, device and values, float32.
That fix is **unsafe**: for a moment the gate ring is allocated twice.
A `dict.fromkeys` table gets a float32 gate entry after the shared ones (`{**dict.fromkeys(RINGS,
dtype), "g_cache": torch.float32}`), which leaves every other entry and the order of the keys as
they were (safe).
"""
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        *OWN_DTYPE_VALID,
        *FROMKEYS_VALID,
        *UNLISTED_VALID,
        *TESTED_VALID,
        *SHARED_DTYPE_VALID,
    )
    INVALID = (*SHARED_DTYPE_INVALID, *FROMKEYS_INVALID, *UNLISTED_INVALID, *TESTED_INVALID)

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._loops: list[_Loop] = []
        self._reported: set[int] = set()
        self._helpers: SharedHelpers | None = None
        self._names = LoopNames(context)

    # ------------------------------------------------------------------ loops over names
    def visit_For(self, node: cst.For) -> None:
        self._loops.append(_Loop(node, node.target, node.iter, self.site()))

    def leave_For(self, original_node: cst.For) -> None:
        self._loops.pop()

    def visit_Call(self, node: cst.Call) -> None:
        site = self.site()
        keyed = keyed_helper_finding(self.context, self.provenance, node, site)
        mapped = tree_map_finding(self.context, self.provenance, node, site)
        spread = spread_record_findings(self.context, self.provenance, node, site)
        for found in [*([keyed] if keyed else []), *([mapped] if mapped else []), *spread]:
            self.report(found.node, found.message, fix=found.fix)
        if not self._loops:
            return
        positional = positional_args(node)
        method = method_name(node)
        if isinstance(node.func, cst.Name) and node.func.value == "setattr":
            if len(positional) == 3:
                holder = positional[0].value  # read as holding a gate cache by attribute
                self._keyed(positional[1].value, positional[2].value, self._loops, holder, by=True)
        elif method == "register_buffer" and len(positional) >= 2:
            self._keyed(positional[0].value, positional[1].value, self._loops)
        elif method == "append" and len(positional) == 1:
            if name := getattr_name(node):
                self._keyed(name, positional[0].value, self._loops)  # one list per ring name
            elif isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name):
                if (
                    named := got_by_name(
                        self.provenance, node.func.value, self._loop_nodes(), self.site()
                    )
                ) is not None:
                    # `rings = getattr(self, name)` ... `rings.append(...)`
                    self._keyed(named, positional[0].value, self._loops)
                    return
                taken = ring_taken_by_name(
                    self.provenance, positional[0].value, self._loop_nodes(), self.site()
                )
                if taken is not None:  # `host.append(getattr(pool, name).half())`
                    self._keyed(taken, positional[0].value, self._loops, casts_only=True)
                    return
                # `for rings in (self.d_cache, self.g_cache): rings.append(...)`
                self._keyed(
                    node.func.value, positional[0].value, self._loops, node.func.value, True
                )

    def visit_Assign(self, node: cst.Assign) -> None:
        named = [t.target for t in node.targets if isinstance(t.target, cst.Name)]
        self._fromkeys(node.value, named[0] if len(node.targets) == 1 and named else None)
        for target in node.targets:
            subject = target.target
            if (
                self._loops
                and isinstance(subject, cst.Subscript)
                and len(subject.slice) == 1
                and isinstance(subject.slice[0].slice, cst.Index)
            ):
                held = got_by_name(self.provenance, subject.value, self._loop_nodes(), self.site())
                if held is not None:  # `rings = getattr(self, name)`; `rings[i] = ring`
                    self._keyed(held, node.value, self._loops, lists_only=True)
                else:
                    self._keyed(
                        subject.slice[0].slice.value, node.value, self._loops, subject.value
                    )
            if isinstance(subject, (cst.Tuple, cst.List)):
                self._unpacked(subject, node.value)
            elif found := read_key_finding(self, subject, node.value):
                self.report(found.node, found.message, fix=found.fix)

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self._fromkeys(node.value, None)

    def _fromkeys(self, value: cst.BaseExpression, bound_to: cst.Name | None) -> None:
        for found in fromkeys_table_findings(
            self.context, self.provenance, value, self.site(), bound_to
        ):
            self.report(found.node, found.message, fix=found.fix)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        for_in = node.for_in
        loop = _Loop(node, for_in.target, for_in.iter, self.site(), "comprehension", for_in.ifs)
        self._keyed(node.key, node.value, [loop], filled_local(node, self.site()))
        if found := dtype_table_finding(self.context, self.provenance, node, self.site()):
            self.report(found.node, found.message, fix=found.fix)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def _comprehension(self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp) -> None:
        if isinstance(node.elt, cst.Name):  # `[t for t in rings]` passes elements on
            return
        for_in = node.for_in
        loop = _Loop(node, for_in.target, for_in.iter, self.site(), "comprehension", for_in.ifs)
        self._keyed(for_in.target, node.elt, [loop])

    def _iterations(self, loop: _Loop) -> list[Iteration] | None:
        if not loop._computed:
            loop._computed = True
            loop._iterations = self.provenance.iterations(loop.target, loop.iterable, loop.site)
            if loop._iterations is None and isinstance(loop.node, cst.DictComp):
                # `(*rings.items(), ("gate", g))`: the literal entries written last
                loop._iterations = trailing_iterations(
                    self.provenance, loop.target, loop.iterable, loop.site
                )
                loop.partial = loop._iterations is not None
        return loop._iterations

    def _keyed(
        self,
        key: cst.BaseExpression,
        value: cst.BaseExpression,
        loops: Sequence[_Loop],
        mapping: cst.BaseExpression | str | None = None,
        appended: bool = False,
        *,
        by: bool = False,
        lists_only: bool = False,
        casts_only: bool = False,
    ) -> None:
        """``value`` (or the element of a per-layer list) is stored under the name ``key`` (of
        the local ``mapping``, when it is one); ``lists_only``: only where the name's caches
        are lists (an element written into a tensor is a copy, which casts); ``casts_only``:
        only a cast written in ``value`` (the ring the loop names, cast where it is stored)."""
        value = value.elt if isinstance(value, (cst.ListComp, cst.GeneratorExp)) else value
        if not isinstance(value, (cst.Call, cst.IfExp, cst.Name, cst.Subscript)):  # no dataflow yet
            return
        for loop in reversed(loops):
            site = self.site()
            if casts_a_module(loop.node):
                return  # RL004's: the loop casts every buffer of a module
            iterations = self._iterations(loop)
            unlisted = iterations is None and isinstance(mapping, cst.BaseExpression)
            if unlisted:
                assert isinstance(mapping, cst.BaseExpression)
                iterations = unlisted_iterations(
                    self.context, key, mapping, loop.node, loop.target, site, attributes=by
                )
            if iterations is None and isinstance(loop.node, cst.DictComp):
                # `Rings(**{name: t.to(dtype) for name, t in layer.items()})`
                iterations = spread_iterations(self.context, loop.node, site)
                unlisted = iterations is not None
            if not iterations:
                # `merged[key] = rows.to(dtype) if key.startswith("prev_") else rows`
                iterations = tested_iterations(self.context, key, value, loop.node, loop.ifs, site)
                unlisted = unlisted or iterations is not None
            if not iterations:
                continue
            unlisted = unlisted or loop.partial
            gate_envs = []
            for env in iterations:
                if any(self.provenance.condition(i.test, site, env) is False for i in loop.ifs):
                    continue
                name = self.provenance.string_value(key, site, env)
                if name is None:  # `f"{name}/{layer}"`: one ring's entry of one layer
                    name = keyed_ring(self.provenance, key, site, env)
                if name is not None and not self.context.gate_caches.matches(name):
                    name = self._names.read_as_gate(mapping, name, site) or name  # `rings["gate"]`
                if name is None or not self.context.gate_caches.matches(name):
                    name = self._names.held_gate(mapping, env, appended)
                if lists_only and name is not None and name not in self._names.lists():
                    continue
                if name is not None and self.context.gate_caches.matches(name):
                    gate_envs.append((name, env))
            if not gate_envs:
                continue
            if only_saved(self.provenance, mapping, site):
                return  # a snapshot's storage format: reading it back uncast is reported there
            variable = naming_variable(key, [env for _, env in gate_envs])
            if variable is None and not unlisted:
                variable = telling_variable(gate_envs, iterations)
            for name, env in gate_envs:
                facts = self.provenance.tensor_facts(value, site, env)
                if not any(f.kind in _REPORTED for f in facts):
                    # `_alloc(shape, dtype)` of a helper of the module, once per cache
                    self._helper_in_loop(value, name, loop, variable, gate_envs, env)
                for fact in facts:
                    if by and unlisted and fact.kind is Kind.LOADED:
                        continue  # `setattr` of every entry of a loaded mapping: RL005's
                    if casts_only and not (
                        fact.kind is Kind.CAST and self.provenance.within(fact.node, value)
                    ):
                        continue
                    if (
                        fact.kind in _REPORTED
                        and not looked_up_by(fact, loop.target, loop.node)
                        and not shared_by_a_table(self.provenance, fact)
                    ):
                        subject = named_gate_cache(self.context.gate_caches, name)
                        if not self.provenance.within(fact.node, site.scope):
                            # made in a function the loop calls: report (and fix nothing) here
                            self._report_loop(fact, subject, loop, None, gate_envs, at=value)
                        elif self.provenance.within(fact.node, loop.node):
                            self._report_loop(fact, subject, loop, variable, gate_envs)
                        else:  # made before the loop, where the loop's name is not bound
                            fix = None
                            if not unlisted:  # other caches' iterations are unknown
                                fix = before_loop_fix(
                                    self.context, fact, key, value, loop.node, iterations, site
                                )
                            self._report_loop(fact, subject, loop, None, gate_envs, fix)
            return

    def _helper_in_loop(
        self,
        value: cst.BaseExpression,
        name: str,
        loop: _Loop,
        variable: str | None,
        gate_envs: list[tuple[str, Iteration]],
        env: Iteration,
    ) -> None:
        call = helper_call(value)
        if call is None:
            return
        iterable = one_line(self.context.module, loop.iterable)
        condition = gate_name_test(variable, [e for _, e in gate_envs])
        subject = named_gate_cache(self.context.gate_caches, name)
        made = LoopCall(loop.word, iterable, env, condition)
        self._check_helper(call, subject, self.site(), None, made)

    def _loop_nodes(self) -> list[cst.CSTNode]:
        return [loop.node for loop in self._loops]

    def _report_loop(
        self,
        fact: TensorFact,
        subject: str,
        loop: _Loop,
        variable: str | None,
        gate_envs: list[tuple[str, Iteration]],
        unconditional: FixDraft | None = None,
        at: cst.CSTNode | None = None,
    ) -> None:
        if id(fact.node) in self._reported:
            return
        self._reported.add(id(fact.node))
        narrow = [d for d in fact.dtypes if not d.is_float32]
        if narrow and all(
            declared_setting(self.context, self.provenance.index, d.node) for d in narrow
        ):
            return  # `dtypes.gate` of `dtypes: RingDtypes`: judged where the record is built
        if keyword_only_setting(self.context, fact, self.site().scope):
            return  # `*, gate_dtype=torch.float32`: judged where each call sets it
        iterable = one_line(self.context.module, loop.iterable)
        condition = gate_name_test(variable, [env for _, env in gate_envs])
        treatment = loop_treatment(
            self.provenance, self.context.module, fact, variable, loop.node, self.site()
        )
        self.report(
            at or treatment.where or fact.node,
            f"{subject} is {made_how(fact)} by a {loop.word} over `{iterable}` "
            f"{treatment.words}; {WHY}",
            fix=unconditional
            if condition is None
            else conditional_fix(
                self.context.module, self.context.spelling.torch_at(self.site()), fact, condition
            ),
        )

    # ------------------------------------------------------- several targets, one dtype
    def _unpacked(self, target: cst.Tuple | cst.List, value: cst.BaseExpression) -> None:
        """``d, k, g = <comprehension>`` or ``= helper(...)`` returning a tuple."""
        positions = [
            (index, element.value, name)
            for index, element in enumerate(target.elements)
            if (name := binding_name(element.value)) is not None
            and self.context.gate_caches.matches(name)
        ]
        if not positions:
            return
        site = self.site()
        comprehension = comprehension_in(value)
        if comprehension is None:
            if isinstance(value, cst.Call):
                for index, element, name in positions:
                    self._check_helper(value, self._subject(element, name), site, index)
            return
        for_in = comprehension.for_in
        loop = _Loop(comprehension, for_in.target, for_in.iter, site, "comprehension", for_in.ifs)
        iterations = self._iterations(loop)
        for index, element, name in positions:
            if reallocates(self.context.index, site.statement, element):
                continue
            subject = self._subject(element, name)
            if iterations is not None and len(iterations) == len(target.elements):
                env = iterations[index]
                variable = naming_variable(for_in.target, [env])
                facts = self.provenance.tensor_facts(comprehension.elt, site, env)
                for fact in facts:
                    if fact.kind in _REPORTED:
                        again = self._unpacked_fix(comprehension, element, index, fact)
                        self._report_loop(fact, subject, loop, variable, [(name, env)], again)
                continue
            numbered = numbered_iteration(for_in, index, site)  # `enumerate`: this position's
            facts = self.provenance.tensor_facts(comprehension.elt, site, numbered)
            for fact in facts:
                if fact.kind in _REPORTED and id(fact.node) not in self._reported:
                    self._reported.add(id(fact.node))
                    self.report(
                        fact.node,
                        f"{subject} is unpacked from one comprehension that gives "
                        f"every cache {shared_treatment(self.context.module, fact)}; give the gate cache its own "
                        f"float32 value ({WHY})",
                        fix=self._unpacked_fix(comprehension, element, index, fact),
                    )

    def _unpacked_fix(
        self,
        comprehension: Comprehension,
        element: cst.BaseExpression,
        index: int,
        fact: TensorFact,
    ) -> FixDraft | None:
        """The gate cache unpacked at ``index`` made again as float32, or else the
        comprehension's loop numbered."""
        torch = self.context.spelling.torch_at(self.site())
        return self._reallocation(comprehension.elt, element) or positional_fix(
            self.context.module, torch, comprehension, index, fact
        )

    def _reallocation(
        self, allocation: cst.BaseExpression, target: cst.BaseExpression
    ) -> FixDraft | None:
        torch = self.context.spelling.torch_at(self.site())
        statement = self.site().statement
        return reallocation_fix(self.context.index, torch, statement, allocation, target)

    def _subject(self, target: cst.BaseExpression, name: str) -> str:
        display = self.context.module.code_for_node(target).strip()
        return named_gate_cache(self.context.gate_caches, name, display)

    # ------------------------------------------------------------------ helper functions
    def check_binding(self, binding: GateCacheBinding) -> None:
        if binding.element is not None:
            return  # `d, k, g = helper(...)`: checked per element where the tuple is unpacked
        call = helper_call(binding.value)
        if call is not None:
            self._check_helper(call, self.subject(binding), binding.site, None)

    def _check_helper(
        self,
        call: cst.Call,
        subject: str,
        site: Site,
        position: int | None,
        loop: LoopCall | None = None,
    ) -> None:
        """The gate cache a helper call makes (one per iteration, in ``loop``), reported once."""
        if self._helpers is None:
            self._helpers = SharedHelpers(self.context, self.provenance)
        found = self._helpers.finding(call, subject, site, position, loop)
        if found is not None and id(found.node) not in self._reported:
            self._reported.add(id(found.node))
            self.report(found.node, found.message, fix=found.fix)
