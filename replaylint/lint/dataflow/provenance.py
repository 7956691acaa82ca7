"""What dtype an expression provably has, and which line made it so.

Two questions, asked at a :class:`~replaylint.lint.syntax.sites.Site`:

* :meth:`Provenance.dtype_facts` — for an expression used as a dtype (``dtype=ring_dtype``): the
  literal dtypes it may be, or that it is not known, following local bindings
  (``ring_dtype = torch.bfloat16``), conditionals and ``x.dtype`` of tensors whose dtype is known.
* :meth:`Provenance.tensor_facts` — for an expression whose value is a tensor: how its dtype was
  decided. Each :class:`TensorFact` is one way it may have been made (a conditional gives two):
  allocated with a literal dtype (``EXPLICIT``) or a non-literal one (``VARIABLE``), allocated
  without a dtype so it inherits one (``INHERITED``), cast (``CAST``), loaded from a checkpoint
  (``LOADED``), provably float32, or unknown.

Tensors named like gate caches that are not bound in the function (parameters, attributes such as
``self.g_cache``, ``caches["g_cache"]``) count as float32: each is checked where it is bound, so a
copy or ``zeros_like`` of one is not reported a second time.

This module holds the core — lookups, dtype expressions, allocations, the dispatch over expression
forms; casts (:mod:`.casts`), loads (:mod:`.loads`) and statically known strings and loops
(:mod:`.strings`) have modules of their own. Every torch name it knows is in :mod:`.torch_api`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import libcst as cst

from replaylint.lint.dataflow import (
    callables,
    callers,
    collisions,
    conditions,
    containers,
    defaults,
    dict_entries,
    imported,
    imported_calls,
    imported_modules,
    loads,
    members,
    methods,
    modules,
    operators,
    records,
    strings,
)
from replaylint.lint.dataflow.allocations import (
    as_allocation,
    dtype_source,
    literal_dtype,
    method_receiver,
)
from replaylint.lint.dataflow.facts import (
    AddDtypeArgument,
    Allocation,
    CastValue,
    DtypeFact,
    Float32Target,
    Kind,
    OverrideKwargsDtype,
    SetDtype,
    TensorFact,
    decided,
    definite_dtype,
)
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.init_parameters import constructor_parameter
from replaylint.lint.dataflow.kwargs import UNKNOWN, DtypeEntries, spreads_dtype
from replaylint.lint.dataflow.scopes import Binding, GuardEvaluator
from replaylint.lint.dataflow.strings import NO_ENV, Bound, Env, Iteration, bound_in
from replaylint.lint.dataflow.torch_api import (
    DTYPE_PRESERVING_ATTRIBUTES,
    DTYPE_PRESERVING_WRAPPERS,
    SAFETENSORS_DICT_LOADERS,
    TORCH_BUFFER_READERS,
    TORCH_LOADERS,
)
from replaylint.lint.dataflow.unpacked import unpacked_dtypes
from replaylint.lint.project.index import ProjectView
from replaylint.lint.syntax.nodes import (
    keyword_arg,
    one_line,
    positional_args,
    string_key,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

__all__ = ["Env", "Provenance"]

_MAX_DEPTH = 12
_DATA_FACTORIES = frozenset({"torch.tensor", "torch.as_tensor"})


def _literal(data: cst.BaseExpression) -> bool:
    """Python numbers or sequences written out (``[0.0] * n``, ``[x for ...]``): their tensor
    takes the default dtype."""
    if isinstance(data, cst.BinaryOperation):
        return _literal(data.left) or _literal(data.right)
    if isinstance(data, cst.UnaryOperation):
        return _literal(data.expression)
    return isinstance(data, (cst.Integer, cst.Float, cst.List, cst.Tuple, cst.ListComp))


@dataclass
class Provenance:
    """Answers dtype questions about the expressions of one module."""

    index: ModuleIndex
    project: ProjectView | None = None
    """The module's view of its project: what names imported from other modules denote."""
    _depth: int = field(default=0)
    _descendants: dict[int, frozenset[int]] = field(default_factory=dict)
    _mappings: collisions.MappingUses | None = field(default=None)
    _passed: dict[int, callers.Passed] = field(default_factory=dict)
    _gate_buffers: dict[str, modules.GateBuffer] | None = field(default=None)
    _imports_holder: bool | None = field(default=None)
    _memo: dict[tuple[int, int, tuple[tuple[str, str | Bound], ...]], tuple[TensorFact, ...]] = (
        field(default_factory=dict)
    )

    # ------------------------------------------------------------------ strings and loops
    def string_value(self, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV) -> str | None:
        """The string ``expr`` provably holds (literals, loop variables, f-strings, constants)."""
        return strings.string_value(self, expr, site, env)

    def condition(self, test: cst.BaseExpression, site: Site, env: Env) -> bool | None:
        """The value of a condition on loop-variable strings, when it is decided by ``env``."""
        return conditions.condition(self, test, site, env)

    def iterations(
        self, target: cst.BaseExpression, iterable: cst.BaseExpression, site: Site
    ) -> list[Iteration] | None:
        """Per iteration of ``for <target> in <iterable>``, the loop variables' known strings."""
        return strings.iterations(self, target, iterable, site)

    def is_loaded(self, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV) -> bool:
        """Whether ``expr`` is (part of) a checkpoint read from disk."""
        return loads.is_loaded(self, expr, site, env)

    def lookup(self, name: str, site: Site, env: Env = NO_ENV) -> list[tuple[Binding, Site]] | None:
        """Bindings of ``name`` that may reach ``site``, each with the site of its statement."""
        guard = self._guard_evaluator(site, env)
        scopes = site.scopes
        found = self.index.scope(scopes[-1]).reaching(name, site.statement, guard)
        if found is not None:
            return [(b, Site(scopes, b.statement)) for b in found]
        for index in range(len(scopes) - 2, -1, -1):
            outer = scopes[index]
            if isinstance(outer, cst.ClassDef):
                continue  # class bodies are not visible from their methods
            found = self.index.scope(outer).reaching(name, None, guard)
            if found is not None:
                return [(b, Site(scopes[: index + 1], b.statement)) for b in found]
        return None

    def _guard_evaluator(self, site: Site, env: Env) -> GuardEvaluator | None:
        if not env:
            return None

        def evaluate(test: cst.BaseExpression) -> bool | None:
            return conditions.condition(self, test, site, env)

        return evaluate

    def dtype_facts(
        self, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV
    ) -> tuple[DtypeFact, ...]:
        """The dtypes ``expr`` may denote (one unknown fact when it cannot be decided)."""
        literal = literal_dtype(self.index, expr)
        if literal is not None:
            return (DtypeFact(literal, expr),)
        if not self.enter():
            return (DtypeFact(None, expr),)
        try:
            return self._dtype_facts(expr, site, env)
        finally:
            self.leave()

    def _dtype_facts(self, expr: cst.BaseExpression, site: Site, env: Env) -> tuple[DtypeFact, ...]:
        bound = bound_in(env, expr)
        if bound is not None:  # a loop variable: what it holds in this iteration
            return self.dtype_facts(bound.expr, bound.site, bound.env(env))
        if self.project is not None and not isinstance(expr, cst.Name):
            # an attribute, call or subscript of a name imported from the project
            from_project = imported.dtype_facts(self, expr, site, env)
            if from_project is not None:
                return from_project
        if isinstance(expr, cst.IfExp):
            decided = conditions.condition(self, expr.test, site, env)
            if decided is True:
                return self.dtype_facts(expr.body, site, env)
            if decided is False:
                return self.dtype_facts(expr.orelse, site, env)
            return self.dtype_facts(expr.body, site, env) + self.dtype_facts(expr.orelse, site, env)
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
            # `dtype or self.dtype`: either operand; `dtype or torch.float32` with a dtype that is
            # None (a default no call overrides) is float32
            right = self.dtype_facts(expr.right, site, env)
            if all(f.is_float32 for f in right) and members.is_none(self, expr.left, site):
                return right
            return self.dtype_facts(expr.left, site, env) + right
        if isinstance(expr, cst.Name) and expr.value not in env:
            found = self.lookup(expr.value, site, env)
            if not found:
                return (DtypeFact(None, expr),)
            if self.project is not None and all(b.kind == "import" for b, _ in found):
                from_project = imported.dtype_facts(self, expr, site, env)
                if from_project is not None:  # a name imported from another module of the project
                    return from_project
            facts: list[DtypeFact] = []
            for binding, binding_site in found:
                if binding.kind == "param":
                    # A default no caller overrides decides the dtype only when it proves
                    # float32; otherwise the parameter stays what callers make of it.
                    default = members.parameter_default(self, binding, env)
                    if default is not None and all(f.is_float32 for f in default):
                        facts.extend(DtypeFact(f.dtype, f.node, binding) for f in default)
                        continue
                    passed = callers.passed_dtype_facts(self, binding)  # what the calls give
                    # calls pass what cannot be told: a float32 default is the helper's choice
                    passed = passed or members.float32_default(self, binding, env)
                    facts.extend(passed or (DtypeFact(None, expr, binding, binding.name),))
                elif binding.kind == "assign" and binding.value is not None:
                    for fact in self.dtype_facts(binding.value, binding_site, env):
                        # a dtype a caller passes keeps the caller's binding: it was chosen there
                        kept = fact.passed_by is not None
                        facts.append(fact if kept else replace(fact, binding=binding))
                elif (unpacked := unpacked_dtypes(self, binding, binding_site, env)) is not None:
                    facts.extend(replace(f, binding=binding) for f in unpacked)
                else:
                    facts.append(DtypeFact(None, expr, binding))
            return tuple(facts)
        if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
            tensor = self.tensor_facts(expr.value, site, env)
            dtypes = [definite_dtype(fact) for fact in tensor]
            if tensor and all(d is not None for d in dtypes):
                return tuple(DtypeFact(d, expr) for d in dtypes)
        if isinstance(expr, cst.Attribute):
            held = records.field_value(self, expr.value, expr.attr.value, site, env)
            if held is not None:  # `spec.dtype` of `spec = RingSpec("g_cache", torch.float32)`
                return self.dtype_facts(held.value, held.site, env)
            # A class constant, field or property proves float32, or the attribute stays unknown
            # (an instance may carry another value than the class default).
            member = members.attribute_dtype(self, expr, site, env)
            if member is not None and all(f.is_float32 for f in member):
                return member
            given = constructor_parameter(self, expr, site)
            if given is not None:  # `self.decay_dtype = decay_dtype` in `__init__`: the parameter's
                return self.dtype_facts(given[0], given[1], env)
            return (DtypeFact(None, expr),)
        if isinstance(expr, cst.Call) and "torch.get_default_dtype" in self.index.qualified_names(
            expr.func
        ):
            default = members.default_dtype(self, env)
            return default if default is not None else (DtypeFact(None, expr),)
        if isinstance(expr, cst.Call):
            returned = members.returned_dtype(self, expr, site)
            if returned is not None:
                return returned
        if isinstance(expr, cst.Subscript):
            mapping, mapping_site = containers.dict_literal(self, expr.value, site, env)
            if mapping is not None:
                entry = containers.dict_entry(self, mapping, expr, site, env)
                if entry is not None:
                    return self.dtype_facts(entry, mapping_site, env)
            element = containers.sequence_entry(self, expr, site, env)
            if element is not None:
                return self.dtype_facts(element[0], element[1], env)
            entries = containers.returned_entries(self, expr, site, env)
            if entries is not None:
                return tuple(f for value, at in entries for f in self.dtype_facts(value, at))
        return (DtypeFact(None, expr),)

    def tensor_facts(
        self, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV
    ) -> tuple[TensorFact, ...]:
        """How ``expr``'s dtype was decided, one fact per way it may have been made."""
        key = (id(expr), id(site.statement), tuple(sorted(env.items())))
        if self._depth == 0 and key in self._memo:
            return self._memo[key]
        if not self.enter():
            return (TensorFact(Kind.UNKNOWN, expr),)
        try:
            facts = tuple(self._tensor_facts(expr, site, env))
        finally:
            self.leave()
        if self._depth == 0:
            self._memo[key] = facts
        return facts

    def _tensor_facts(self, expr: cst.BaseExpression, site: Site, env: Env) -> Iterator[TensorFact]:
        if isinstance(expr, cst.IfExp):
            decided = conditions.condition(self, expr.test, site, env)
            if decided is not False:
                yield from self.tensor_facts(expr.body, site, env)
            if decided is not True:
                yield from self.tensor_facts(expr.orelse, site, env)
            return
        if isinstance(expr, cst.Name):
            if expr.value == "None":
                return
            bound = bound_in(env, expr)
            if bound is not None:  # a loop variable: what it holds in this iteration
                yield from self.tensor_facts(bound.expr, bound.site, bound.env(env))
                return
            yield from self._name_facts(expr, site, env)
            return
        if isinstance(expr, cst.Attribute):
            gate = self.index.gate_caches.matches(expr.attr.value)
            held = records.field_value(self, expr.value, expr.attr.value, site, env)
            if expr.attr.value in DTYPE_PRESERVING_ATTRIBUTES:
                yield from self.tensor_facts(expr.value, site, env)
            elif held is not None and not (gate and held.passed != "positional"):
                # `rings.g` of `rings = Rings(d, k, g16)`; a gate-cache field given by keyword
                # or by its default is a binding of its own, checked there
                yield from self.tensor_facts(held.value, held.site, env)
            elif gate:
                yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            else:
                yield TensorFact(Kind.UNKNOWN, expr)
            return
        if isinstance(expr, cst.Subscript):
            yield from self._subscript_facts(expr, site, env)
            return
        if isinstance(expr, cst.Call):
            yield from self._call_facts(expr, site, env)
            return
        if isinstance(expr, (cst.UnaryOperation, cst.BinaryOperation)):
            yield from operators.operator_facts(self, expr, site, env)
            return
        # Per-layer rings: `g_caches = [torch.zeros(...) for _ in range(layers)]`.
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
            yield from self.tensor_facts(expr.elt, site, strings.element_env(expr, site, env))
            return
        if isinstance(expr, cst.DictComp):
            yield from self.tensor_facts(expr.value, site, env)
            return
        if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
            for element in expr.elements:
                if not isinstance(element, cst.StarredElement):
                    yield from self.tensor_facts(element.value, site, env)
            return
        masked = isinstance(expr, cst.Comparison)  # `positions < length`: a bool mask
        yield TensorFact(Kind.NOT_FLOATING if masked else Kind.UNKNOWN, expr)

    def _name_facts(self, expr: cst.Name, site: Site, env: Env) -> Iterator[TensorFact]:
        found = self.lookup(expr.value, site, env) or []
        assigned = [
            (binding, facts)
            for binding, binding_site in found
            if (facts := self._bound_facts(binding, binding_site, env)) is not None
        ]
        if found and len(assigned) == len(found):
            for binding, facts in assigned:
                for fact in facts:
                    yield fact.followed(binding, expr)
            return
        if self.index.gate_caches.matches(expr.value):
            yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            return
        if found and len(found) == 1 and found[0][0].kind == "param":
            passed = callers.passed_facts(self, found[0][0], expr)
            if passed is not None:
                yield from passed
                return
        for binding, facts in assigned:
            for fact in facts:
                yield fact.followed(binding, expr)
        entry = loads.loaded_entry(self, found, expr, env)  # `for name, t in state.items():`
        yield entry if entry is not None else TensorFact(Kind.UNKNOWN, expr)

    def _bound_facts(
        self, binding: Binding, binding_site: Site, env: Env
    ) -> tuple[TensorFact, ...] | None:
        """A local binding's value's facts (for ``d, k, g = value``, its element's); or None."""
        if binding.kind in {"assign", "with"} and binding.value is not None:
            return self.tensor_facts(binding.value, binding_site, env)
        return callables.element_binding_facts(self, binding, binding_site, env)

    def _subscript_facts(self, expr: cst.Subscript, site: Site, env: Env) -> Iterator[TensorFact]:
        key = self._subscript_key(expr, site, env)
        if loads.is_loaded(self, expr.value, site, env):
            yield TensorFact(
                Kind.LOADED,
                expr,
                detail=loads.describe_load(self.index, expr.value),
                target=CastValue(expr),
            )
            return
        if key is not None:
            if self.index.gate_caches.matches(key):
                yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            else:  # `rings["gate"]` of a dict the scope builds
                entry = dict_entries.entry_facts(self, expr.value, key, site, env)
                yield from entry if entry is not None else (TensorFact(Kind.UNKNOWN, expr),)
            return
        index = expr.slice[0].slice if len(expr.slice) == 1 else None
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
            # `rings[2]` of a tuple or NamedTuple built here: that element alone
            held = records.field_value(self, expr.value, int(index.value.value, 0), site, env)
            if held is not None:
                yield from self.tensor_facts(held.value, held.site, env)
                return
        # Indexing or slicing a tensor keeps its dtype.
        yield from self.tensor_facts(expr.value, site, env)

    def _subscript_key(self, expr: cst.Subscript, site: Site, env: Env) -> str | None:
        key = string_key(expr)
        if key is not None or len(expr.slice) != 1:
            return key
        index = expr.slice[0].slice
        if isinstance(index, cst.Index) and env:
            return strings.string_value(self, index.value, site, env)
        return None

    def _call_facts(self, call: cst.Call, site: Site, env: Env) -> Iterator[TensorFact]:
        names = self.index.qualified_names(call.func)
        if names & DTYPE_PRESERVING_WRAPPERS:
            positional = positional_args(call)
            data = positional[0] if positional else keyword_arg(call, "data")
            if data is not None:
                yield from self.tensor_facts(data.value, site, env)
                return
        if names & TORCH_LOADERS:
            # safetensors returns a dict of tensors; torch.load whatever was saved.
            container = bool(names & SAFETENSORS_DICT_LOADERS)
            yield TensorFact(
                Kind.LOADED,
                call,
                call=call,
                detail=loads.loader_name(names),
                target=None if container else CastValue(call),
            )
            return
        if names & TORCH_BUFFER_READERS:
            yield from loads.frombuffer_facts(self, call, site, env)
            return
        if "torch.from_numpy" in names:
            yield from loads.from_numpy_facts(self, call, site, env)
            return
        if "getattr" in names or (isinstance(call.func, cst.Name) and call.func.value == "getattr"):
            args = positional_args(call)
            if len(args) >= 2:
                attribute = strings.string_value(self, args[1].value, site, env)
                if attribute is not None and self.index.gate_caches.matches(attribute):
                    yield TensorFact(Kind.FLOAT32, call, detail="a gate cache")
                    return
            yield TensorFact(Kind.UNKNOWN, call)
            return
        allocation = as_allocation(self.index, call)
        if allocation is not None:
            yield from self._allocation_facts(allocation, site, env)
            return
        receiver = method_receiver(self.index, call)
        computed = operators.call_facts(self, call, names, receiver, site, env)
        if computed is None:
            computed = callables.callable_facts(self, call, site, env)
        if computed is None and self.project is not None:
            computed = imported_calls.tensor_facts(self, call, site, env)
        if computed is not None:
            yield from computed
            return
        yield from methods.method_facts(self, call, receiver, site, env)

    def _allocation_facts(
        self, allocation: Allocation, site: Site, env: Env
    ) -> Iterator[TensorFact]:
        call = allocation.call
        dtype_arg = allocation.dtype_arg
        if dtype_arg is not None:
            yield self.dtype_decided(allocation, ((dtype_arg.value, site),), env)
            return
        spreads = [arg.value for arg in call.args if arg.star == "**"]
        if spreads:
            passed = spreads_dtype(self, spreads, site, env)
            mapping = spreads[-1]
            if isinstance(passed, DtypeEntries):
                yield self.dtype_decided(
                    allocation,
                    passed.values,
                    env,
                    via_kwargs=mapping,
                    overridable=len(spreads) == 1,
                )
                return
            if passed is UNKNOWN:
                yield TensorFact(
                    Kind.VARIABLE,
                    mapping,
                    allocation=allocation,
                    dtypes=(DtypeFact(None, mapping),),
                    detail="`**` keyword arguments",
                    # `{**kw, "dtype": torch.float32}` is float32 whatever kw holds; with two
                    # spreads the other one may hold a dtype too.
                    target=OverrideKwargsDtype(mapping) if len(spreads) == 1 else None,
                )
                return
        if allocation.kind == "factory":
            data = positional_args(call)[0].value if positional_args(call) else None
            if allocation.function in _DATA_FACTORIES and data is not None and not _literal(data):
                # `torch.tensor(array)` takes the data's dtype: a Python list of floats is what
                # follows the default dtype
                yield from self.tensor_facts(data, site, env)
                return
            yield defaults.default_dtype_fact(self, allocation, site, env)
            return
        source = dtype_source(self.index, allocation)  # like or new_*: that tensor's dtype
        source_facts = self.tensor_facts(source, site, env) if source is not None else ()
        if source_facts and all(f.kind is Kind.PASSED for f in source_facts):
            # the dtype the function's callers pass; a dtype argument makes this one float32
            yield from (replace(f, target=AddDtypeArgument(call)) for f in source_facts)
            return
        if self.all_float32(source_facts):
            yield TensorFact(Kind.FLOAT32, call)
            return
        if source_facts and all(f.kind is Kind.NOT_FLOATING for f in source_facts):
            yield TensorFact(Kind.NOT_FLOATING, call, allocation=allocation)
            return
        described = (
            "another tensor" if source is None else f"`{one_line(self.index.module, source)}`"
        )
        yield TensorFact(
            Kind.INHERITED,
            call,
            allocation=allocation,
            call=call,
            detail=f"the dtype of {described}",
            target=AddDtypeArgument(call),
        )

    def dtype_decided(
        self,
        allocation: Allocation,
        candidates: Sequence[tuple[cst.BaseExpression, Site]],
        env: Env,
        *,
        via_kwargs: cst.BaseExpression | None = None,
        overridable: bool = True,
    ) -> TensorFact:
        """The fact for an allocation whose dtype is one of ``candidates``, given directly
        (``dtype=x``) or through a ``**`` mapping."""
        facts = tuple(
            fact for expr, where in candidates for fact in self.dtype_facts(expr, where, env)
        )
        node: cst.BaseExpression = via_kwargs if via_kwargs is not None else candidates[0][0]
        target: Float32Target | None = SetDtype(node)
        if via_kwargs is not None:
            target = OverrideKwargsDtype(node) if overridable else None
        return decided(facts, node, target, allocation)

    def passed_dtypes(
        self, binding: Binding, compute: Callable[[], callers.Passed]
    ) -> callers.Passed:
        """What the module's calls pass for the parameter ``binding`` (see :mod:`.callers`)."""
        if id(binding.node) not in self._passed:
            self._passed[id(binding.node)] = None  # a call that passes the parameter on
            self._passed[id(binding.node)] = compute()
        return self._passed[id(binding.node)]

    def gate_buffers(self) -> dict[str, modules.GateBuffer]:
        """The module's unguarded classes that hold a floating gate buffer, by name (found once
        for every rule that asks: module casts, assigning loads)."""
        if self._gate_buffers is None:
            self._gate_buffers = modules.gate_buffer_classes(self)
        return self._gate_buffers

    def imports_gate_buffer_holder(self) -> bool:
        """Whether the module imports a project class that holds a gate buffer (asked once)."""
        if self._imports_holder is None:
            self._imports_holder = imported_modules.imports_gate_buffer_holder(self)
        return self._imports_holder

    def is_mapping(self, name: str, site: Site | None = None, display: str | None = None) -> bool:
        """Whether the gate-cache name ``name``, bound at ``site`` as ``display`` (the target
        as written), is a mapping (not a tensor)."""
        if self._mappings is None:
            self._mappings = collisions.mapping_uses(self)
        return collisions.used_as_mapping(self._mappings, name, site, display)

    def within(self, node: cst.CSTNode, root: cst.CSTNode) -> bool:
        """Whether ``node`` is ``root`` or one of its descendants."""
        inside = self._descendants.get(id(root))
        if inside is None:
            inside = self._descendants[id(root)] = frozenset(map(id, descendants(root)))
        return id(node) in inside

    def all_float32(self, facts: Sequence[TensorFact]) -> bool:
        return bool(facts) and all(f.kind is Kind.FLOAT32 for f in facts)

    def enter(self) -> bool:
        if self._depth >= _MAX_DEPTH:
            return False
        self._depth += 1
        return True

    def leave(self) -> None:
        self._depth -= 1
