"""Names imported from other modules of the project: the dtypes and allocations they stand for.

The module under analysis writes ``dtype=GATE_RING_DTYPE``, ``dtype=policy.WIRE_DTYPE``,
``dtype=gate_ring_dtype()``, ``dtype=STR_DTYPE_TO_TORCH_DTYPE[flag]``, ``dtype=cfg.gate_dtype``
(``cfg: CacheConfig``) or ``alloc_ring(shape, dtype)`` with the name imported from another module
of the project. When the run has a project index (:mod:`replaylint.lint.project`), the name is
resolved through the imports to its definition, and that definition's summary is evaluated here:
constants and aliases, functions (their parameters bound to the call's arguments), string tables,
class constants, dataclass fields and properties; calls of the project's allocation helpers,
partials and lambdas are :mod:`.imported_calls`'s.

Only what is certain counts: a definition the summary marks unknown (rebound, conditional,
mutated), an attribute assigned anywhere in the defining module or here, a dataclass field of an
instance built elsewhere (which may carry another value; it vouches only for float32) or anything
the summaries do not describe is not known, and the name stays what it was without the index.
Every fact carries where its dtype was written (file and line) for the finding's message; a fix
stays in the module under analysis (``dtype=torch.float32`` at the call, or a cast of a fresh
allocation the helper returns), never in the module that defines the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import libcst as cst

from replaylint.lint.dataflow.facts import (
    DtypeFact,
)
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.dataflow.summary_values import Here, as_value
from replaylint.lint.dataflow.torch_api import (
    dtype_from_qualified_name,
)
from replaylint.lint.project.index import External, Found, Origin, Target
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_MAX_STEPS = 64  # evaluation steps per question: summaries are small, chains are short
MALFORMED = (IndexError, KeyError, TypeError, ValueError, AttributeError)
"""What reading a summary of an unexpected shape raises: no answer, never a crash."""


@dataclass(frozen=True)
class There:
    """A value written in a project module, evaluated in its context."""

    value: Value
    context: Context


@dataclass(frozen=True)
class Instance:
    """``self`` of a class: its definition, and whether its fields hold their defaults."""

    found: Found
    defaults_hold: bool


@dataclass(frozen=True)
class Context:
    module: str
    params: Mapping[str, Here | There] = field(default_factory=dict)
    instance: Instance | None = None
    origins: tuple[Origin, ...] = ()


class Unknown(Exception):
    """Something on the way is not certain: the question has no answer from the project."""


@dataclass
class Evaluation:
    prov: Provenance
    node: cst.BaseExpression
    """The expression of the module under analysis that the facts are about."""
    steps: int = 0
    read_here: set[int] = field(default_factory=set)
    """The expressions of the module whose string value was looked up in the project."""

    def step(self) -> None:
        self.steps += 1
        if self.steps > _MAX_STEPS or not self.prov.enter():
            raise Unknown
        self.prov.leave()

    # ------------------------------------------------------------------ targets
    def target(self, value: Value, context: Context) -> Target | There | Here:
        """What a name-like value denotes; a parameter's argument as it was passed."""
        self.step()
        kind = value[0]
        if kind in {"__here__", "__there__"}:
            return value[1]  # type: ignore[no-any-return]
        if kind == "param":
            bound = context.params.get(str(value[1]))
            if bound is None:
                raise Unknown
            return bound
        if kind in {"self", "call", "__instance__", "__bound__", "__member__"}:
            return There(value, context)
        view = self.prov.project
        assert view is not None
        if kind == "ref" and value[1] == "":  # a dotted name as the module under analysis reads it
            dotted = str(value[2])
            found = view.resolve(dotted)
            chain = found.origins if isinstance(found, (Found, External)) else ()
            if any(self.prov.index.assigns_module_attribute(o.name) for o in chain):
                raise Unknown  # `policy.WIRE_DTYPE = ...` here: the module's value may not hold
            if found is None and "." in dotted.lstrip("."):  # `Policy.WIRE`: a class's member
                head, _, last = dotted.rpartition(".")
                return self.target(["attr", ["ref", "", head], last], context)
            return _known(found)
        if kind == "attr":
            base = self.target(value[1], context)
            if isinstance(base, Found) and base.definition[0] == "class":
                return There(["__member__", base, value[2]], context)
            if isinstance(base, (Here, There)):
                if value[1][0] in {"call", "__instance__", "__bound__"}:
                    return There(value, context)  # an attribute of an instance
                raise Unknown
            return _known(view.index.attribute(base, str(value[2]), context.origins))
        target = view.index.value_target(context.module, value, context.origins, 0)
        if target is None and kind in {"name", "ref", "module"}:
            raise Unknown
        return target if target is not None else There(value, context)

    # ------------------------------------------------------------------ dtypes
    def dtypes(self, value: Value, context: Context) -> list[DtypeFact]:
        """The dtypes a project value may be; raises :class:`Unknown` when not certain."""
        self.step()
        kind = value[0]
        if kind in {"name", "ref", "module", "attr", "param", "__here__", "__there__"}:
            return self.target_dtypes(self.target(value, context), context)
        if kind == "self":
            return self.member_dtypes(context.instance, str(value[1]), context)
        if kind == "__member__":  # `CacheConfig.RING_DTYPE`: read on the class
            instance = Instance(value[1], defaults_hold=True)
            return self.member_dtypes(instance, str(value[2]), context, on_class=True)
        if kind == "item":
            return self.dtypes(self.item(value[1], value[2], context), context)
        if kind == "call":
            return self.call_dtypes(value, context)
        if kind == "either":  # one of the values a function may return: each must be known
            branches = self.possible(value, context)
            return [fact for branch in branches for fact in self.dtypes(branch, context)]
        raise Unknown

    def possible(self, either: Value, context: Context) -> list[Value]:
        """The branches of ``either`` that may be returned (:mod:`.return_choice`)."""
        from replaylint.lint.dataflow.return_choice import possible

        return possible(self, either, context)

    def target_dtypes(self, target: Target | There | Here, context: Context) -> list[DtypeFact]:
        if isinstance(target, Here):
            facts = self.prov.dtype_facts(target.expr, target.site, target.env)
            return list(facts)
        if isinstance(target, There):
            if target.value[0] == "attr" and target.value[1][0] in {
                "call",
                "__instance__",
                "__bound__",
            }:
                return self.attribute_dtypes(target.value, target.context)
            return self.dtypes(target.value, target.context)
        if isinstance(target, External):
            dtype = dtype_from_qualified_name(target.name)
            if dtype is None:
                raise Unknown
            return [self.fact(dtype, target.origins)]
        if isinstance(target, Found) and target.definition[0] == "value":
            inner = Context(target.module, origins=target.origins)
            return self.dtypes(target.definition[2], inner)
        raise Unknown

    def attribute_dtypes(self, value: Value, context: Context) -> list[DtypeFact]:
        """``<instance>.name`` of a class of the project (``CacheConfig().ring_dtype``)."""
        base = value[1]
        kind = base[0]
        if kind == "__bound__":  # `cfg = CacheConfig()` earlier: frozen, or it may have changed
            kind, base = "call", base[1]
        if kind == "call" and (returned := self._returned(base, context)) is not None:
            return self.returned_field_dtypes(*returned, str(value[2]))
        if kind in {"call", "__instance__"}:
            found = self.target(base[1], context)
            if isinstance(found, Found) and found.definition[0] == "class":
                # `CacheConfig()` keeps every default; `cfg: CacheConfig` was built elsewhere
                member = found.definition[2].get(str(value[2]))
                with_arguments = kind == "call" and bool(base[2] or base[3])
                fresh = value[1][0] == "call" or found.definition[3]["frozen"]
                if (
                    with_arguments
                    and fresh
                    and member is not None
                    and member[0] == "field"
                    and isinstance(found.definition[3].get("fields"), list)
                ):  # `RingDtypes(delta=dtype, key=dtype).gate`: the argument, or the default
                    return self.returned_field_dtypes(base, context, str(value[2]))
                if with_arguments and (member is None or member[0] != "property"):
                    raise Unknown  # built with arguments here: which field they set is not read
                holds = kind == "call" and not with_arguments and fresh
                # built here, it is of that very class: its own property is the one read
                exact = kind == "call" and member is not None and member[0] == "property"
                return self.member_dtypes(
                    Instance(found, holds), str(value[2]), context, exact=exact
                )
        raise Unknown

    def returned_field_dtypes(self, value: Value, context: Context, name: str) -> list[DtypeFact]:
        """Field ``name`` of the record a project function returns (``CacheDtypes(gate=...)``
        on each ``return``): the argument that fills it, or the field's default."""
        if value[0] == "either":
            return [
                f for branch in value[1] for f in self.returned_field_dtypes(branch, context, name)
            ]
        if value[0] != "call":
            raise Unknown
        found = self.target(value[1], context)
        if not (isinstance(found, Found) and found.definition[0] == "class"):
            raise Unknown
        fields = found.definition[3].get("fields")
        for keyword, argument in value[3]:
            if keyword == name:
                return self.dtypes(argument, context)
        if isinstance(fields, list) and name in fields and fields.index(name) < len(value[2]):
            return self.dtypes(value[2][fields.index(name)], context)
        return self.member_dtypes(Instance(found, True), name, context)

    def member_dtypes(
        self,
        instance: Instance | None,
        name: str,
        context: Context,
        *,
        on_class: bool = False,
        exact: bool = False,
    ) -> list[DtypeFact]:
        if instance is None:
            raise Unknown
        found = instance.found
        members, flags = found.definition[2], found.definition[3]
        member = members.get(name)
        view = self.prov.project
        assert view is not None
        summary = view.index.summary(found.module) or {}
        assigned = set(summary.get("assigned", ()))
        if (
            member is None
            or member[0] in {"unknown", "method"}
            or (flags.get("bases") and not exact and member[0] != "property")
        ):
            # an inherited member, or a value a base class's `__init__` may set on the
            # instance; a property of the class itself cannot be set that way
            raise Unknown
        if member[0] != "property" and (
            name in assigned or "*" in assigned or self.prov.index.assigns_attribute(name)
        ):
            raise Unknown  # an instance may carry another value than the class's
        where = Origin(f"{found.name}.{name}", view.index.path_of(found.module), int(member[1]))
        inner = Context(found.module, instance=instance, origins=(*found.origins, where))
        if member[0] == "property":
            if on_class:
                raise Unknown  # the property object, not its value
            return self.dtypes(member[2], inner)
        if member[0] == "field" and flags.get("init"):
            raise Unknown  # a custom __init__ or __post_init__ may set it
        facts = self.dtypes(member[2], inner)
        # built elsewhere, the field may hold any value it was given: the default vouches only
        # for float32 (as for a dataclass of the module itself)
        if (
            member[0] == "field"
            and not instance.defaults_hold
            and not all(f.is_float32 for f in facts)
        ):
            raise Unknown
        return facts

    def item(self, table: Value, key: Value, context: Context) -> Value:
        """``TABLE[key]`` with a literal table and a key known statically; of a function that
        returns one of several tuples, the entry of each (``["either", ...]``)."""
        if table[0] == "item":  # `RING_DTYPES[mode][2]`: the element of each possible entry
            entry = self.item(table[1], table[2], context)
            if entry[0] == "either":
                return ["either", [self.item(branch, key, context) for branch in entry[1]], False]
        returned = self._returned(table, context)
        if returned is not None and returned[0][0] == "either":
            wanted = self.string(key, context)
            value, inner = returned
            return ["either", [self.item(branch, ["const", wanted], inner) for branch in value[1]]]
        entries = self.table(table, context)
        if entries and any(k is None for k, _ in entries):
            # `PRECISION_TO_DTYPE[...]` keyed by enum members: one of its values, whatever the key
            return ["either", [_bound(v, context) for _, v in entries], False]
        try:
            wanted = self.string(key, context)
        except Unknown:
            if not entries or not all(isinstance(k, str) for k, _ in entries):
                raise
            # `RING_DTYPES[mode]` of a key not known here: any of the table's entries
            return ["either", [_bound(v, context) for _, v in entries], False]
        for entry_key, entry_value in entries:
            if entry_key == wanted:
                return _bound(entry_value, context)
        raise Unknown

    def _returned(self, value: Value, context: Context) -> tuple[Value, Context] | None:
        """What a call of a project function returns, with its parameters bound; None for
        another value."""
        if value[0] != "call":
            return None
        callee = self.target(value[1], context)
        method = isinstance(callee, There) and callee.value[0] == "attr"  # `cfg.ring_shapes()`
        if not method and (not isinstance(callee, Found) or callee.definition[0] != "function"):
            return None
        return self.called(callee, value[2], value[3], context)

    def table(self, value: Value, context: Context) -> list[Any]:
        """The entries of a literal dict (by key) or tuple (by position) a value denotes."""
        self.step()
        kind = value[0]
        if kind == "table":
            return [[k, There(v, context)] for k, v in value[1]]
        if kind == "tuple":
            return [[i, There(v, context)] for i, v in enumerate(value[1])]
        if kind == "values":  # keys that are not read: the values alone, under no key
            return [[None, There(v, context)] for v in value[1]]
        if kind == "item":  # `SPECS["g_cache"][1]`: an entry of an entry
            return self.table(self.item(value[1], value[2], context), context)
        returned = self._returned(value, context)
        if returned is not None:  # `ring_dtype, gate_dtype = ring_dtypes(...)`
            return self.table(*returned)
        if kind == "attr" and value[1][0] in {"call", "__instance__", "__bound__"}:
            return self.property_table(value, context)  # `params.ring_shapes`
        target = self.target(value, context)
        if isinstance(target, Found) and target.definition[0] == "value":
            inner = Context(target.module, origins=target.origins)
            return self.table(target.definition[2], inner)
        if isinstance(target, There) and target.value is not value:
            return self.table(target.value, target.context)
        raise Unknown

    def property_table(self, value: Value, context: Context) -> list[Any]:
        """The entries of what a property of a project class returns, read on an instance
        (``params.ring_shapes`` of ``params: StateParams``)."""
        base = value[1][1] if value[1][0] == "__bound__" else value[1]
        found = self.target(base[1], context)
        if not (isinstance(found, Found) and found.definition[0] == "class"):
            raise Unknown
        member = found.definition[2].get(str(value[2]))
        if member is None or member[0] != "property":
            raise Unknown
        inner = Context(found.module, instance=Instance(found, False), origins=found.origins)
        return self.table(member[2], inner)

    def string(self, value: Value, context: Context) -> str | int:
        self.step()
        if value[0] == "const" and isinstance(value[1], (str, int)):
            return value[1]
        target = self.target(value, context)
        if isinstance(target, Here):
            if isinstance(target.expr, cst.Integer):
                return int(target.expr.value, 0)
            text = self.prov.string_value(target.expr, target.site, target.env)
            if text is not None:
                return text
            # `flags.KV_CACHE_DTYPE_FLAG`: a string constant of a module imported whole
            if id(target.expr) in self.read_here:
                raise Unknown  # its value leads back to it: nothing of the project's to read
            self.read_here.add(id(target.expr))
            written = as_value(self.prov, target.expr, target.site, target.env)
            if written is None or self.prov.project is None:
                raise Unknown
            return self.string(written, Context(self.prov.project.module))
        if isinstance(target, There):
            if target.value == value:
                raise Unknown  # an attribute of an instance that nothing here sets
            return self.string(target.value, target.context)
        if isinstance(target, Found) and target.definition[0] == "value":
            return self.string(target.definition[2], Context(target.module))
        raise Unknown

    def call_dtypes(self, value: Value, context: Context) -> list[DtypeFact]:
        """A call in a project value: a function of the project, ``get_default_dtype()``,
        ``TABLE.get(key)`` or ``getattr(torch, "bfloat16")``."""
        func, args = value[1], value[2]
        if func[0] == "attr" and func[2] == "get" and len(args) == 1 and not value[3]:
            return self.dtypes(self.item(func[1], args[0], context), context)
        if func == ["name", "getattr"] and len(args) == 2 and not value[3]:
            module = self.target(args[0], context)
            if isinstance(module, External):
                dtype = dtype_from_qualified_name(f"{module.name}.{self.string(args[1], context)}")
                if dtype is not None:
                    return [self.fact(dtype, context.origins)]
            raise Unknown
        callee = self.target(func, context)
        if isinstance(callee, External) and callee.name == "torch.get_default_dtype":
            from replaylint.lint.dataflow.members import default_dtype

            found = default_dtype(self.prov, {})
            if found is None:
                raise Unknown
            return [self.fact(f.dtype, context.origins) for f in found]
        function, inner = self.called(callee, value[2], value[3], context)
        return self.dtypes(function, inner)

    def called(
        self,
        callee: Target | There | Here,
        args: list[Any],
        keywords: list[Any],
        context: Context | None,
    ) -> tuple[Value, Context]:
        """The result value of a project function or lambda, with its parameters bound."""
        if isinstance(callee, Found) and callee.definition[0] == "function":
            params, result = callee.definition[2], callee.definition[3]
            module, origins = callee.module, callee.origins
        elif isinstance(callee, Found) and callee.definition[0] == "value":
            lambda_ = callee.definition[2]
            if lambda_[0] != "lambda":
                raise Unknown
            params, result = lambda_[1], lambda_[2]
            module, origins = callee.module, callee.origins
        elif isinstance(callee, There) and callee.value[0] == "attr":
            from replaylint.lint.dataflow.imported_methods import bound_method

            return bound_method(self, callee, args, keywords, context)
        else:
            raise Unknown
        if result[0] == "unknown":
            raise Unknown
        definitions = Context(module, origins=origins)
        bound = bind_arguments(params, args, keywords, definitions, context)
        return result, Context(module, bound, origins=origins)

    def fact(self, dtype: str | None, origins: tuple[Origin, ...]) -> DtypeFact:
        return DtypeFact(dtype, self.node, origin=describe_origins(origins))


def _known(target: Target) -> Target:
    if target is None:
        raise Unknown
    return target


def _bound(value: Any, context: Context) -> Value:
    """A table entry: already wrapped with its context, or a bare value."""
    if isinstance(value, There):
        return ["__there__", value]
    return value  # type: ignore[no-any-return]


def bind_arguments(
    params: list[Any],
    args: list[Any],
    keywords: list[Any],
    definitions: Context,
    caller: Context | None,
) -> dict[str, Here | There]:
    """Parameters -> what the call passes (written here or in a project module) or defaults."""
    if any(kind in {"star", "starstar"} for _, kind, _ in params):
        if args and any(kind == "star" for _, kind, _ in params):
            positional = [p for p in params if p[1] == "pos"]
            if len(args) > len(positional):
                args = args[: len(positional)]  # extra positionals go to *args: not read
        named = {str(p[0]) for p in params}
        if any(keyword not in named for keyword, _ in keywords):
            raise Unknown
    positional = [p for p in params if p[1] == "pos"]
    if len(args) > len(positional):
        raise Unknown
    bound: dict[str, Here | There] = {}
    passed: dict[str, Any] = {str(p[0]): a for p, a in zip(positional, args, strict=False)}
    for keyword, argument in keywords:
        if keyword in passed:
            raise Unknown
        passed[str(keyword)] = argument
    for name, kind, default in params:
        if kind in {"star", "starstar"}:
            continue
        argument = passed.get(str(name))
        if isinstance(argument, list) and argument and argument[0] == "__here__":
            bound[str(name)] = argument[1]
        elif argument is not None:
            if caller is None:
                raise Unknown
            bound[str(name)] = There(argument, caller)
        elif default is not None:
            bound[str(name)] = There(default, definitions)
    return bound


def describe_origins(origins: tuple[Origin, ...]) -> str:
    """``from `CACHE_DTYPE` at pkg/cfg.py:3, defined as `WIRE_DTYPE` at pkg/policy.py:4``: the
    name the module imported, and the definition the chain ends at."""
    if not origins:
        return ""
    last = origins[-1]
    # a class member names the value better than the class it was reached through
    members = [origin for origin in origins if "." in origin.name]
    first = members[-1] if members else origins[0]
    if first == last:
        return f"from {last.describe()}"
    return f"from {first.describe()}, defined as {last.describe()}"


# ---------------------------------------------------------------------- entry points
def dtype_facts(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env
) -> tuple[DtypeFact, ...] | None:
    """The dtypes ``expr`` denotes through the project index; None when it does not say."""
    return _project_dtypes(prov, expr, lambda: as_value(prov, expr, site, env))


def element_dtype_facts(
    prov: Provenance, value: cst.BaseExpression, position: int, site: Site, env: Env
) -> tuple[DtypeFact, ...] | None:
    """The dtypes of element ``position`` of what a call of a project function returns, or of
    an entry of a project table (``ring_dtype, gate_dtype = ring_dtypes(config)``,
    ``... = RING_DTYPES[mode]``); None when the index does not say."""

    def element() -> Value | None:
        call = as_value(prov, value, site, env)
        return None if call is None else ["item", call, ["const", position]]

    return _project_dtypes(prov, value, element)


def _project_dtypes(
    prov: Provenance, node: cst.BaseExpression, value_of: Callable[[], Value | None]
) -> tuple[DtypeFact, ...] | None:
    """The dtypes of the summary value ``value_of`` makes of ``node``, evaluated through the
    project index; None when there is no value or the index does not say."""
    if prov.project is None:
        return None
    evaluation = Evaluation(prov, node)
    try:
        value = value_of()
        if value is None:
            return None
        facts = evaluation.dtypes(value, Context(prov.project.module))
    except (Unknown, *MALFORMED):
        return None
    return tuple(facts) or None


def string_value(prov: Provenance, expr: cst.Name, site: Site) -> str | None:
    """The string an imported constant holds (``GATE_KEY = "g_cache"`` in another module)."""
    if prov.project is None:
        return None
    evaluation = Evaluation(prov, expr)
    try:
        value = as_value(prov, expr, site, {})
        if value is None:
            return None
        text = evaluation.string(value, Context(prov.project.module))
    except (Unknown, *MALFORMED):
        return None
    return text if isinstance(text, str) else None
