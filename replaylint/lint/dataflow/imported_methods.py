"""Methods of another module's classes, called on an instance; the strings of its collections.

``self.model_args.ring_shapes()`` with ``model_args`` an instance of ``ModelArgs`` of another
module of the project: the method's summary (what its straight-line body, or each of its
``return`` statements, gives: :mod:`replaylint.lint.project.summaries`) is evaluated as a
function's is, ``self`` being the instance and the other parameters bound to the call's
arguments. A dict it returns gives the keys a loop over it reads (the ring names of a
comprehension that allocates every ring), a dtype the dtype. The instance's fields hold their
defaults only when it is built here without arguments; otherwise a field vouches only for
float32, as for a property.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import libcst as cst

from replaylint.lint.dataflow.imported import (
    MALFORMED,
    Context,
    Evaluation,
    Instance,
    There,
    Unknown,
    bind_arguments,
)
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.index import Found, Origin
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["bound_method", "collection_strings", "yielded_items"]

_INSTANCES = frozenset({"__instance__", "__bound__", "call"})


def bound_method(
    evaluation: Evaluation,
    callee: There,
    args: list[Any],
    keywords: list[Any],
    caller: Context | None,
) -> tuple[Value, Context]:
    """The result value of ``<instance>.<method>(...)`` with its parameters bound; raises
    :class:`Unknown` when the receiver is no instance of a project class or the method's result
    is not summarised."""
    value = callee.value
    base = value[1]
    if not isinstance(base, list) or not base or base[0] not in _INSTANCES:
        raise Unknown
    kind = base[0]
    if kind == "__bound__":  # `cfg = CacheConfig()` earlier: frozen, or it may have changed
        kind, base = "call", base[1]
    found = evaluation.target(base[1], callee.context)
    if not isinstance(found, Found) or found.definition[0] != "class":
        raise Unknown
    members, flags = found.definition[2], found.definition[3]
    name = str(value[2])
    member = members.get(name)
    if member is None or member[0] != "method" or len(member) < 4 or member[2][0] == "unknown":
        raise Unknown
    params = member[3]
    built_here = kind == "call" and not (base[2] or base[3])
    holds = built_here and (value[1][0] == "call" or bool(flags.get("frozen")))
    view = evaluation.prov.project
    assert view is not None
    where = Origin(f"{found.name}.{name}", view.index.path_of(found.module), int(member[1]))
    definitions = Context(found.module, origins=found.origins)
    bound = bind_arguments(params[1:], args, keywords, definitions, caller)
    inner = Context(found.module, bound, Instance(found, holds), (*found.origins, where))
    return member[2], inner


def collection_strings(
    prov: Provenance, expr: cst.BaseExpression, site: Site
) -> tuple[bool, list[str]] | None:
    """The strings of a collection another module of the project defines or returns: an
    imported tuple constant (``TENSOR_FIELDS = ("ssm_state", "d_ring", ...)``), what a project
    function returns, or a method of an instance of a project class
    (``self.model_args.ring_shapes()``). ``(True, keys)`` for a dict with string keys,
    ``(False, elements)`` for a tuple or list of strings; None when not every one is known."""
    if prov.project is None:
        return None
    evaluation = Evaluation(prov, expr)
    context = Context(prov.project.module)
    try:
        value = as_value(prov, expr, site, {})
        if value is None:
            return None
        entries = evaluation.table(value, context)
        if entries and all(isinstance(key, str) for key, _ in entries):
            return True, [key for key, _ in entries]
        if any(not isinstance(key, int) for key, _ in entries):
            return None
        texts = [evaluation.string(entry.value, entry.context) for _, entry in entries]
    except (Unknown, *MALFORMED):
        return None
    strings = [text for text in texts if isinstance(text, str)]
    return (False, strings) if len(strings) == len(texts) else None


def yielded_items(
    prov: Provenance, call: cst.Call, site: Site
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """The ``(name, tensor)`` items a generator method of a project class yields, as a loop
    over ``call`` takes them: the tensor read as the receiver's attribute (``pool.g_cache``)
    where the method yields its own, else unknown (``_``)."""
    if not isinstance(call.func, cst.Attribute):
        return None
    pairs = _yielded_pairs(prov, call, site)
    if pairs is None:
        return None
    receiver = call.func.value
    return [
        (
            cst.Tuple(
                [
                    cst.Element(cst.SimpleString(repr(key))),
                    cst.Element(
                        cst.Name("_") if attr is None else cst.Attribute(receiver, cst.Name(attr))
                    ),
                ]
            ),
            site,
        )
        for key, attr in pairs
    ]


def _yielded_pairs(
    prov: Provenance, expr: cst.Call, site: Site
) -> list[tuple[str, str | None]] | None:
    """What a generator method of another module's class yields, when every item is a pair
    whose first element is a string (``yield "state", self.state``): per item, the string and
    the attribute of ``self`` it yields beside it (None for anything else); None when the
    method is no such generator (:mod:`replaylint.lint.project.yielded`)."""
    if prov.project is None:
        return None
    evaluation = Evaluation(prov, expr)
    try:
        value = as_value(prov, expr, site, {})
        if value is None or value[0] != "call":
            return None
        callee = evaluation.target(value[1], Context(prov.project.module))
        if not isinstance(callee, There):
            return None
        result, context = bound_method(evaluation, callee, value[2], value[3], None)
        if result[0] != "yields":
            return None
        pairs: list[tuple[str, str | None]] = []
        for item in result[1]:
            if item[0] != "tuple" or len(item[1]) != 2:
                return None
            key = evaluation.string(item[1][0], context)
            if not isinstance(key, str):
                return None
            second = item[1][1]
            pairs.append((key, str(second[1]) if second[0] == "self" else None))
    except (Unknown, *MALFORMED):
        return None
    return pairs
