"""Strings the analysis can evaluate statically: literals, constants, f-strings, loop names.

``env`` maps loop variables to the string they hold in one iteration (RL006 evaluates the body of
``for name in ("d_cache", "g_cache")`` once per gate-cache name); conditions on them
(``torch.float32 if name == "g_cache" else dtype``) are then decided statically, and
:func:`iterations` lists what each iteration of a loop over a literal collection binds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.own_buffers import own_buffer_items
from replaylint.lint.dataflow.own_dicts import own_dict
from replaylint.lint.dataflow.record_names import asdict_fields, record_fields_named
from replaylint.lint.syntax.nodes import (
    class_body_values,
    constant_slice,
    literal_string,
    method_name,
    name_attribute,
    positional_args,
    read_names,
)
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


@dataclass(frozen=True)
class Bound:
    """A loop variable bound to an expression that is not a known string in one iteration
    (``dt`` in ``for name, dt in zip(NAMES, DTYPES)``), evaluated where it was written."""

    expr: cst.BaseExpression
    site: Site
    outer: tuple[tuple[str, str | Bound], ...] | None = None
    """The loop variables where ``expr`` is read, when they differ from the ones of the code
    that reads the variable (an argument bound to a parameter of the function it calls)."""

    def env(self, current: Env) -> Env:
        """The loop variables ``expr`` is evaluated with."""
        return current if self.outer is None else dict(self.outer)


Env = Mapping[str, "str | Bound"]
"""Loop variables and what each holds in the iteration being evaluated."""
NO_ENV: Env = {}
Iteration = dict[str, "str | Bound"]
"""What each loop variable holds in one iteration of a loop over a literal collection."""


def bound_in(env: Env, expr: cst.BaseExpression) -> Bound | None:
    """What the loop variable ``expr`` is bound to in ``env``, if it is one bound to an
    expression."""
    if isinstance(expr, cst.Name):
        value = env.get(expr.value)
        if isinstance(value, Bound):
            return value
    return None


def string_value(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV
) -> str | None:
    """The string ``expr`` provably holds (literals, loop variables, f-strings, constants)."""
    if isinstance(expr, cst.SimpleString):
        return literal_string(expr)
    if (
        isinstance(expr, cst.Attribute)
        and env
        and isinstance(key := env.get(name_attribute(expr) or ""), str)
    ):
        return key  # `entry.name` of `for entry in meta.entries`, in one iteration
    if isinstance(expr, cst.Name):
        if expr.value in env:
            value = env[expr.value]
            if not isinstance(value, Bound):
                return value
            if not prov.enter():
                return None
            try:
                return string_value(prov, value.expr, value.site, value.env(env))
            finally:
                prov.leave()
        # Looked up without ``env``: pruning branches by conditions would evaluate more
        # strings, and a condition on the name itself would never end.
        found = prov.lookup(expr.value, site)
        if found and len(found) == 1 and found[0][0].kind == "import" and prov.project is not None:
            from replaylint.lint.dataflow.imported import string_value as imported_string

            return imported_string(prov, expr, site)
        if found and len(found) == 1 and found[0][0].value is not None:
            binding, binding_site = found[0]
            if binding.kind == "assign" and prov.enter():
                try:
                    assert binding.value is not None
                    return string_value(prov, binding.value, binding_site, env)
                finally:
                    prov.leave()
        return None
    if isinstance(expr, cst.FormattedString):
        parts: list[str] = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                parts.append(part.value)
            elif isinstance(part, cst.FormattedStringExpression) and (
                part.format_spec is None and part.conversion is None
            ):
                text = string_value(prov, part.expression, site, env)
                if text is None:
                    return None
                parts.append(text)
            else:
                return None
        return "".join(parts)
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and prov.enter():
        # `spec.name` of `spec = RingSpec("g_cache", shape)` (or a loop over such records)
        try:
            from replaylint.lint.dataflow.records import field_value

            held = field_value(prov, expr.value, expr.attr.value, site, env)
            if held is None:
                return None
            return string_value(prov, held.value, held.site, env)
        finally:
            prov.leave()
    if isinstance(expr, cst.ConcatenatedString):
        left = string_value(prov, expr.left, site, env)
        right = string_value(prov, expr.right, site, env)
        return None if left is None or right is None else left + right
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left = string_value(prov, expr.left, site, env)
        right = string_value(prov, expr.right, site, env)
        return None if left is None or right is None else left + right
    return None


def numbered_iteration(loop: cst.CompFor, position: int, site: Site) -> Iteration:
    """For ``for i, x in enumerate(...)``: ``i`` holds ``position`` (what ``x`` holds is not
    known); nothing for any other loop."""
    target, iterable = loop.target, loop.iter
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Name)
        and iterable.func.value == "enumerate"
        and len(iterable.args) == 1
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(counter := target.elements[0].value, cst.Name)
    ):
        return {counter.value: Bound(cst.Integer(str(position)), site)}
    return {}


def string_options(
    prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env
) -> tuple[str, ...] | None:
    if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
        values = [string_value(prov, e.value, site, env) for e in expr.elements]
        if any(v is None for v in values):
            return None
        return tuple(v for v in values if v is not None)
    if isinstance(expr, (cst.Name, cst.Attribute)):  # `FP32_KEYS`, of this module or imported
        items = _literal_items(prov, expr, site, 0)
        if items is None:
            return None
        named = [string_value(prov, item, at, env) for item, at in items]
        if any(v is None for v in named):
            return None
        return tuple(v for v in named if v is not None)
    return None


def iterations(
    prov: Provenance, target: cst.BaseExpression, iterable: cst.BaseExpression, site: Site
) -> list[Iteration] | None:
    """For ``for <target> in <iterable>`` over a literal collection (directly, through a
    constant of this module or a tuple another module of the project defines, a slice with
    literal bounds, ``.items()``, ``zip``, ``enumerate``): per iteration, the loop variables that
    hold a known string. None when the iterable is not a literal collection."""
    items = _literal_items(prov, iterable, site, 0)
    if items is None:
        return None
    result: list[Iteration] = []
    for item, item_site in items:
        env: Iteration = {}
        _match(prov, target, item, item_site, env)
        result.append(env)
    return result


def naming_variable(key: cst.BaseExpression, envs: Sequence[Iteration]) -> str | None:
    """The one loop variable the name ``key`` builds depends on (``name``, ``kind``), when every
    iteration of ``envs`` gives it a string."""
    used = {node.value for node in read_names(key)}
    candidates = [v for v in used if all(isinstance(env.get(v), str) for env in envs)]
    return candidates[0] if len(candidates) == 1 else None


def _literal_items(
    prov: Provenance, expr: cst.BaseExpression, site: Site, depth: int
) -> list[tuple[cst.BaseExpression, Site]] | None:
    if depth > 4:
        return None
    if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
        if any(isinstance(e, cst.StarredElement) for e in expr.elements):
            return None
        return [(e.value, site) for e in expr.elements]
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp)) and isinstance(expr.elt, cst.Name):
        loop = expr.for_in  # `[name for name, _ in self.named_buffers()]`: one per item
        items = (
            None
            if loop.ifs or loop.inner_for_in
            else _literal_items(prov, loop.iter, site, depth + 1)
        )
        picked = [
            (_picked(prov, loop.target, item, at, expr.elt.value), at) for item, at in items or ()
        ]
        if items is None or any(value is None for value, _ in picked):
            return None
        return [(value, at) for value, at in picked if value is not None]
    if isinstance(expr, cst.Dict):
        keys = [e.key for e in expr.elements if isinstance(e, cst.DictElement)]
        return None if len(keys) != len(expr.elements) else [(k, site) for k in keys]
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site)
        if not found or len(found) != 1:
            return None
        binding, binding_site = found[0]
        if binding.kind == "import" and prov.project is not None:
            texts = _project_strings(prov, expr, site)  # a tuple of names another module defines
            if texts is None or texts[0]:
                return None  # a dict: its iteration order is its keys', read elsewhere
            return [(cst.SimpleString(repr(t)), site) for t in texts[1]]
        if binding.value is None:
            return None
        return _literal_items(prov, binding.value, binding_site, depth + 1)
    fields = record_fields_named(prov, expr, site)
    if fields is not None:  # `Rings._fields` of a NamedTuple: its field names
        return [(cst.SimpleString(repr(name)), site) for name in fields]
    constant = _class_constant(prov, expr, site)
    if constant is not None:  # `for name in self.ring_names` of `ring_names = (...)` in the class
        return _literal_items(prov, constant, site, depth + 1)
    if isinstance(expr, cst.Attribute) and prov.project is not None:
        texts = _project_strings(prov, expr, site)  # `ReplayCache.float_buffers` of an import
        if texts is not None and not texts[0]:
            return [(cst.SimpleString(repr(t)), site) for t in texts[1]]
    cut = constant_slice(expr)
    if cut is not None:  # `RINGS[:3]`
        assert isinstance(expr, cst.Subscript)
        whole = _literal_items(prov, expr.value, site, depth + 1)
        return None if whole is None else whole[cut]
    if not isinstance(expr, cst.Call):
        return None
    owned = own_buffer_items(expr, site)  # `self.named_buffers()` of a class's own buffers
    if owned is not None:
        return owned
    args = positional_args(expr)
    returned = _returned_literal(prov, expr, site)
    if returned is not None:  # `names()`, `self.rings()`: a function of the module returns it
        return _literal_items(prov, returned[0], returned[1], depth + 1)
    if isinstance(expr.func, cst.Name) and len(args) == len(expr.args):
        function = expr.func.value
        if function in {"list", "tuple"} and len(args) == 1:
            return _literal_items(prov, args[0].value, site, depth + 1)
        if function == "enumerate" and len(args) == 1:
            items = _literal_items(prov, args[0].value, site, depth + 1)
            if items is None:
                return None
            return [
                (_pair(cst.Integer(str(i)), item), item_site)
                for i, (item, item_site) in enumerate(items)
            ]
        if function == "zip" and args:
            columns = [_literal_items(prov, a.value, site, depth + 1) for a in args]
            known = [c for c in columns if c is not None]
            if not known:
                return None
            # a column that is not literal (`zip(RING_NAMES, tensors)`): its i-th element
            length = min(len(c) for c in known)
            filled = [
                column
                if column is not None
                else [(_element_at(arg.value, i), site) for i in range(length)]
                for column, arg in zip(columns, args, strict=True)
            ]
            if any(column is None for column in filled):
                return None
            rows = zip(*filled, strict=False)
            return [(cst.Tuple([cst.Element(item) for item, _ in row]), site) for row in rows]
    if prov.project is not None:  # `pool.named_states()`, a generator method of the project
        from replaylint.lint.dataflow.imported_methods import yielded_items

        pairs = yielded_items(prov, expr, site)
        if pairs is not None:
            return pairs
    texts = _project_strings(prov, expr, site)  # `self.model_args.ring_names()`
    if texts is not None:
        return [(cst.SimpleString(repr(t)), site) for t in texts[1]]
    method = method_name(expr)
    if method in {"items", "keys", "values"} and not args:
        assert isinstance(expr.func, cst.Attribute)
        return _mapping_items(prov, expr.func.value, site, method, depth)
    return None


def mapping_keys(prov: Provenance, mapping: cst.BaseExpression, site: Site) -> list[str] | None:
    """The keys of the dict ``mapping`` holds, as ``mapping.keys()`` would list them, when each
    is a known string: a literal, a local or ``self`` attribute bound to one, a function's."""
    items = _mapping_items(prov, mapping, site, "keys", 0)
    if items is None:
        return None
    keys = [string_value(prov, key, at) for key, at in items]
    return None if any(key is None for key in keys) else [key for key in keys if key is not None]


def _mapping_items(
    prov: Provenance, mapping: cst.BaseExpression | None, site: Site, method: str, depth: int
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """``mapping.keys()``, ``.values()`` or ``.items()`` (``method``), item by item."""
    mapping_site = site
    if isinstance(mapping, cst.Name):
        found = prov.lookup(mapping.value, site)
        if not found or len(found) != 1:
            return None
        mapping, mapping_site = found[0][0].value, found[0][1]
    if isinstance(mapping, cst.Call) and _zipped_dict(mapping):
        return _zipped_items(prov, mapping, mapping_site, method, depth)
    fields = asdict_fields(prov, mapping, mapping_site) if mapping is not None else None
    if fields is not None:  # `state._asdict().items()` of `state: Rings`: its fields
        keys = [cst.SimpleString(repr(name)) for name in fields]
        if method == "keys":
            return [(key, site) for key in keys]
        if method == "values":
            return None
        return [(_pair(key, cst.Name("_")), site) for key in keys]
    if isinstance(mapping, cst.Call):  # asked where the call is written
        returned = _returned_literal(prov, mapping, mapping_site)
        if returned is None:  # `self.model_args.ring_shapes().items()`: a project method's
            return _project_items(prov, mapping, mapping_site, method)
        mapping, mapping_site = returned
    own = own_dict(prov, mapping, mapping_site) if mapping is not None else None
    if own is not None:  # `self.rings.items()` of `self.rings = {...}` in the class
        mapping, mapping_site = own
    elif isinstance(mapping, cst.Attribute):  # `params.ring_shapes`: a project property's
        return _project_items(prov, mapping, mapping_site, method)
    if isinstance(mapping, cst.DictComp):
        return _comprehended_items(prov, mapping, mapping_site, method, depth)
    if not isinstance(mapping, cst.Dict):
        return None
    elements = [e for e in mapping.elements if isinstance(e, cst.DictElement)]
    if len(elements) != len(mapping.elements):
        return None
    if method == "keys":
        return [(e.key, mapping_site) for e in elements]
    if method == "values":
        return [(e.value, mapping_site) for e in elements]
    return [(_pair(e.key, e.value), mapping_site) for e in elements]


def _project_strings(
    prov: Provenance, expr: cst.BaseExpression, site: Site
) -> tuple[bool, list[str]] | None:
    if prov.project is None:
        return None
    from replaylint.lint.dataflow.imported_methods import collection_strings

    return collection_strings(prov, expr, site)


def _project_items(
    prov: Provenance, mapping: cst.Call | cst.Attribute, site: Site, method: str
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """The keys (values, items) of a dict a function or method of another module returns: a
    value is the call's entry (``mapping["g_cache"]``), as written here."""
    texts = _project_strings(prov, mapping, site)
    if texts is None or not texts[0]:
        return None
    keys = [cst.SimpleString(repr(key)) for key in texts[1]]
    if method == "keys":
        return [(key, site) for key in keys]
    values = [cst.Subscript(mapping, [cst.SubscriptElement(cst.Index(key))]) for key in keys]
    if method == "values":
        return [(value, site) for value in values]
    return [(_pair(key, value), site) for key, value in zip(keys, values, strict=True)]


def _element_at(sequence: cst.BaseExpression, position: int) -> cst.BaseExpression:
    """``sequence[position]``."""
    index = cst.SubscriptElement(cst.Index(cst.Integer(str(position))))
    return cst.Subscript(sequence, [index])


def _comprehended_items(
    prov: Provenance, mapping: cst.DictComp, site: Site, method: str, depth: int
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """The keys (values, items) of ``{name: f(name) for name in ("d", "k", "g")}``: a key is the
    string it evaluates to in each iteration; a value, the expression as written."""
    loop = mapping.for_in
    if loop.inner_for_in is not None or loop.ifs or depth > 4:
        return None
    found = iterations(prov, loop.target, loop.iter, site)
    if found is None:
        return None
    keys = [string_value(prov, mapping.key, site, env) for env in found]
    if any(key is None for key in keys):
        return None
    written = [cst.SimpleString(repr(key)) for key in keys]
    if method == "keys":
        return [(key, site) for key in written]
    if method == "values":
        return [(mapping.value, site) for _ in written]
    return [(_pair(key, mapping.value), site) for key in written]


def _zipped_items(
    prov: Provenance, mapping: cst.Call, site: Site, method: str, depth: int
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """``dict(zip(NAMES, shapes)).items()``: the names are the keys (a value that is not a
    literal is left unknown)."""
    zipped = mapping.args[0].value
    assert isinstance(zipped, cst.Call)
    keys = _literal_items(prov, zipped.args[0].value, site, depth + 1)
    values = _literal_items(prov, zipped.args[1].value, site, depth + 1)
    if keys is None or method == "values":
        return None
    if method == "keys":
        return keys
    if values is None or len(values) != len(keys):
        values = [(cst.Name("_"), site) for _ in keys]
    return [
        (_pair(key, value), key_site)
        for (key, key_site), (value, _) in zip(keys, values, strict=True)
    ]


def _zipped_dict(call: cst.Call) -> bool:
    """``dict(zip(keys, values))``."""
    inner = call.args[0].value if len(call.args) == 1 else None
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == "dict"
        and isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Name)
        and inner.func.value == "zip"
        and len(inner.args) == 2
        and not any(arg.star or arg.keyword for arg in inner.args)
    )


def _returned_literal(
    prov: Provenance, call: cst.Call, site: Site
) -> tuple[cst.BaseExpression, Site] | None:
    """The literal collection a function or method of the module returns, when its one
    ``return`` returns one (``def rings(self): return {"d_cache": ..., "g_cache": ...}``)."""
    from replaylint.lint.dataflow.helpers import called_function

    found = called_function(prov.index, prov, call, site)
    if found is None:
        from replaylint.lint.dataflow.instances import method_of_instance

        method = method_of_instance(prov, call, site)  # `self.config.ring_shapes(batch)`
        if method is None:
            return None
        function, scopes = method
    else:
        function, scopes, _ = found
    returns = prov.index.scope(function).returns
    if len(returns) != 1 or returns[0][0].value is None:
        return None
    value = returns[0][0].value
    if not isinstance(value, (cst.Tuple, cst.List, cst.Dict)):
        return None
    return value, Site(scopes, returns[0][1])


def element_env(comprehension: cst.ListComp | cst.GeneratorExp, site: Site, env: Env) -> Env:
    """``env`` with the variable of ``[f(x) for x in xs]`` bound to ``xs``: the element of a
    sequence has the facts of the sequence's elements."""
    clause = comprehension.for_in
    if clause.inner_for_in is not None or not isinstance(clause.target, cst.Name):
        return env
    return {**env, clause.target.value: Bound(clause.iter, site, tuple(env.items()))}


def trailing_iterations(
    prov: Provenance, target: cst.BaseExpression, iterable: cst.BaseExpression, site: Site
) -> list[Iteration] | None:
    """For a tuple or list iterable whose unknown parts are spread first (``(*rings.items(),
    ("gate", self.g_ring))``), one iteration per literal element after the last spread: the
    entries a dict comprehension over it writes last, which no spread element overwrites."""
    if not isinstance(iterable, (cst.Tuple, cst.List)):
        return None
    elements = list(iterable.elements)
    starred = [i for i, e in enumerate(elements) if isinstance(e, cst.StarredElement)]
    tail = elements[starred[-1] + 1 :] if starred else elements
    result: list[Iteration] = []
    for element in tail:
        env: Iteration = {}
        _match(prov, target, element.value, site, env)
        result.append(env)
    return result or None


def _match(
    prov: Provenance,
    target: cst.BaseExpression,
    item: cst.BaseExpression,
    site: Site,
    env: Iteration,
) -> None:
    if isinstance(target, cst.Name):
        value = string_value(prov, item, site)
        env[target.value] = value if value is not None else Bound(item, site)
    elif (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(item, (cst.Tuple, cst.List))
        and len(target.elements) == len(item.elements)
    ):
        for sub_target, sub_item in zip(target.elements, item.elements, strict=True):
            _match(prov, sub_target.value, sub_item.value, site, env)


def _picked(
    prov: Provenance, target: cst.BaseExpression, item: cst.BaseExpression, site: Site, name: str
) -> cst.BaseExpression | None:
    """What the loop variable ``name`` of ``target`` holds for ``item``, as an expression."""
    env: Iteration = {}
    _match(prov, target, item, site, env)
    value = env.get(name)
    return cst.SimpleString(repr(value)) if isinstance(value, str) else getattr(value, "expr", None)


def _pair(first: cst.BaseExpression, second: cst.BaseExpression) -> cst.Tuple:
    return cst.Tuple([cst.Element(first), cst.Element(second)])


def _class_constant(
    prov: Provenance, expr: cst.BaseExpression, site: Site
) -> cst.BaseExpression | None:
    """The value of ``self.X`` / ``cls.X`` (``Cache.X`` of a class of the module) when the
    enclosing class (that class) binds ``X`` once in its body and the module never assigns an
    attribute ``X``."""
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)):
        return None
    if expr.value.value in {"self", "cls"}:
        owner = site.enclosing_class()
    else:
        owner = next(
            (
                statement
                for statement in prov.index.module.body
                if isinstance(statement, cst.ClassDef) and statement.name.value == expr.value.value
            ),
            None,
        )
    if owner is None:
        return None
    name = expr.attr.value
    values = class_body_values(owner, name, annotated=False)
    # the module-wide question walks the whole tree: ask it only of a class constant; a
    # `setattr` by name sets instances (`setattr(cache, name, ring)`), not the class
    on_class = expr.value.value != "self"
    if len(values) != 1 or prov.index.assigns_attribute(name, by_setattr=not on_class):
        return None
    return values[0]
