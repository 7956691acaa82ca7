"""Dtype policies: tables keyed by cache name, and settings named for the gate cache's dtype.

``{"state": torch.float32, "d_cache": dtype, "k_cache": dtype, "g_cache": dtype}`` is no tensor,
but a policy: whoever allocates the rings from it gives the gate ring the dtype of its
``"g_cache"`` entry. A dict literal is such a table when another entry is a literal torch dtype,
or is the very dtype setting the gate entry is (``"d_cache": dtype, ..., "g_cache": dtype``:
every ring in one dtype); its gate-cache entry is then judged as an allocation's dtype would be
(float32, a non-float32 literal, or a dtype that is not provably float32), and the fix sets the
entry to float32.
A setting named for the gate cache's dtype (``gate_dtype: torch.dtype = torch.bfloat16``) is the
same policy in one name: :func:`gate_dtype_name` says when a name is one,
:func:`narrower_literals` when its value holds a non-float32 literal, and
:func:`borrowed_gate_dtype` when it is given the dtype of another setting (``gate_dtype =
self.dtype``, ``gate_dtype=args.cache_dtype``, ``TABLE.get(flag, self.dtype)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.allocations import literal_dtype
from replaylint.lint.dataflow.dtype_records import spread_elements
from replaylint.lint.dataflow.dtype_strings import string_dtype
from replaylint.lint.dataflow.facts import DtypeFact, SetDtype, TensorFact, decided
from replaylint.lint.syntax.nodes import binding_name, is_none_literal, literal_string, read_names
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def table_entry_facts(
    prov: Provenance, table: cst.CSTNode, entry: cst.BaseExpression, site: Site
) -> tuple[TensorFact, ...] | None:
    """The fact of ``entry``, the gate-cache value of the dict literal ``table``, when the dict
    is a dtype table; None when it is not one."""
    if not isinstance(table, cst.Dict):
        return None
    others = [
        element.value
        for element in table.elements
        if isinstance(element, cst.DictElement) and element.value is not entry
    ]
    return _entry_facts(prov, others, entry, site)


@dataclass(frozen=True)
class ZippedEntry:
    """The gate entry of a zipped dtype table (:func:`zipped_table_entries`)."""

    name: str
    value: cst.BaseExpression
    facts: tuple[TensorFact, ...]
    spread: cst.BaseExpression | None = None
    """The spread (``(dtype,) * 3`` of ``*(dtype,) * 3``) the value is an element of."""
    place: int = 0
    """The value's place among the elements of ``spread``."""


def zipped_table_entries(prov: Provenance, call: cst.Call, site: Site) -> list[ZippedEntry]:
    """``dict(zip(NAMES, (state_dtype, dtype, dtype, dtype)))``, a dtype table built from a list
    of cache names (a literal, a constant, ``Rings._fields``) and a literal of values (spreads
    such as ``*(dtype,) * 3`` written out): for each gate-cache name, its value and that value's
    fact (as for a dict literal's entry)."""
    if not (
        isinstance(call.func, cst.Name)
        and call.func.value == "dict"
        and len(call.args) == 1
        and not call.args[0].star
        and call.args[0].keyword is None
    ):
        return []
    zipped = call.args[0].value
    if not (
        isinstance(zipped, cst.Call)
        and isinstance(zipped.func, cst.Name)
        and zipped.func.value == "zip"
        and len(zipped.args) == 2
        and all(not arg.star and arg.keyword is None for arg in zipped.args)
        and isinstance(values := zipped.args[1].value, (cst.Tuple, cst.List))
    ):
        return []
    elements = _elements(values)
    envs = prov.iterations(cst.Name("name"), zipped.args[0].value, site)
    if elements is None or envs is None or len(envs) != len(elements):
        return []
    found = []
    for place, (env, (value, spread, within)) in enumerate(zip(envs, elements, strict=True)):
        key = env.get("name")
        if not isinstance(key, str) or not prov.index.gate_caches.matches(key):
            continue
        others = [other for i, (other, _, _) in enumerate(elements) if i != place]
        facts = _entry_facts(prov, others, value, site)
        if facts is not None:
            found.append(ZippedEntry(key, value, facts, spread, within))
    return found


def _elements(
    values: cst.Tuple | cst.List,
) -> list[tuple[cst.BaseExpression, cst.BaseExpression | None, int]] | None:
    """The values of a tuple literal, spread literals (``*(dtype,) * 3``) written out: each with
    the spread it comes from and its place there."""
    elements: list[tuple[cst.BaseExpression, cst.BaseExpression | None, int]] = []
    for element in values.elements:
        if isinstance(element, cst.StarredElement):
            spread = spread_elements(element.value)
            if spread is None:
                return None
            elements.extend((e, element.value, i) for i, e in enumerate(spread))
        else:
            elements.append((element.value, None, 0))
    return elements


def _entry_facts(
    prov: Provenance, others: list[cst.BaseExpression], entry: cst.BaseExpression, site: Site
) -> tuple[TensorFact, ...] | None:
    if not any(
        _literal_dtype(prov, value, site) or _same_dtype_setting(prov, value, entry)
        for value in others
    ) and not _only_dtypes(prov, entry, others):
        return None
    dtypes = prov.dtype_facts(entry, site)
    if not dtypes:
        return None
    return (decided(dtypes, entry, SetDtype(entry)),)


def _only_dtypes(
    prov: Provenance, entry: cst.BaseExpression, others: list[cst.BaseExpression]
) -> bool:
    """``{"ssm_state": None, "g_cache": torch.float16}``: the gate entry a torch dtype written out,
    every other entry None (keep the tensor's own) or a dtype too."""
    if literal_dtype(prov.index, entry) is None:
        return False
    return all(
        is_none_literal(value) or literal_dtype(prov.index, value) is not None for value in others
    )


def _same_dtype_setting(
    prov: Provenance, value: cst.BaseExpression, entry: cst.BaseExpression
) -> bool:
    """Whether ``value`` is written like ``entry`` and names a dtype setting (``dtype``,
    ``self.dtype``, ``config.torch_dtype``): every ring of the table given the one dtype."""
    if not isinstance(value, (cst.Name, cst.Attribute)) or not isinstance(
        entry, (cst.Name, cst.Attribute)
    ):
        return False
    name = binding_name(value)
    if name is None or (name.lower() != "dtype" and not name.lower().endswith("_dtype")):
        return False
    module = prov.index.module
    return module.code_for_node(value) == module.code_for_node(entry)


def _literal_dtype(prov: Provenance, value: cst.BaseExpression, site: Site) -> bool:
    if not isinstance(value, (cst.Attribute, cst.Name)):
        return False
    facts = prov.dtype_facts(value, site)
    return bool(facts) and all(fact.dtype is not None for fact in facts)


_FLOATING = frozenset({"float16", "bfloat16", "float64", "float32"})


def gate_dtype_name(prov: Provenance, target: cst.CSTNode | None, site: Site) -> str | None:
    """The name of ``target`` when it is named for the gate cache's dtype (``gate_dtype``,
    ``g_cache_dtype``, or a gate cache's own name declared ``torch.dtype``); None otherwise."""
    if not isinstance(target, (cst.Name, cst.Attribute)):
        return None
    name = binding_name(target)
    names = prov.index.gate_caches
    if name is None or not (
        names.names_gate_dtype(name) or (names.matches(name) and _declared_a_dtype(target, site))
    ):
        return None
    return name


def narrower_literals(prov: Provenance, value: cst.BaseExpression, site: Site) -> list[str] | None:
    """The floating dtypes other than float32 that ``value`` may be, when it is only ever
    floating literals and not always float32; None otherwise."""
    return narrower_in(prov.dtype_facts(value, site))


def narrower_in(facts: Iterable[DtypeFact]) -> list[str] | None:
    """The floating dtypes other than float32 among ``facts``, when each is a floating
    literal and not all are float32; None otherwise."""
    literals = {fact.dtype for fact in facts}
    narrower = sorted(d for d in literals if d is not None and d != "float32")
    if not literals or None in literals or not narrower or not literals <= _FLOATING:
        return None
    return narrower


def _declared_a_dtype(target: cst.CSTNode, site: Site) -> bool:
    """Whether ``target`` is declared ``<name>: torch.dtype = ...`` in its statement: a field
    named like the gate cache itself that holds its dtype (``decay_ring: torch.dtype``); or
    ``<name>: str = "float16"``, the dtype's name (a wire format's field)."""
    statement = site.statement
    body = statement.body if isinstance(statement, cst.SimpleStatementLine) else ()
    return any(
        isinstance(small, cst.AnnAssign)
        and small.target is target
        and (is_dtype_annotation(small.annotation) or _names_a_dtype_as_text(small))
        for small in body
    )


def _names_a_dtype_as_text(declaration: cst.AnnAssign) -> bool:
    annotation = declaration.annotation.annotation
    text = literal_string(declaration.value) if declaration.value is not None else None
    return (
        isinstance(annotation, cst.Name)
        and annotation.value == "str"
        and text is not None
        and string_dtype(text) is not None
    )


def is_dtype_annotation(annotation: cst.Annotation) -> bool:
    """``torch.dtype`` or ``dtype`` (also optional: ``Optional[torch.dtype]``, ``torch.dtype |
    None``)."""
    return any(
        isinstance(node, (cst.Name, cst.Attribute)) and binding_name(node) == "dtype"
        for node in descendants(annotation.annotation)
    )


# settings whose dtype is float32 by their role: the checkpoint state, accumulators, master weights
_FLOAT32_ROLES = frozenset({"state", "ssm", "acc", "accum", "master", "fp32", "float32", "f32"})
# words of a gate's own dtype setting, however qualified
_GATE_WORDS = frozenset({"gate", "g", "decay", "alpha", "forget"})


def borrowed_gate_dtype(
    prov: Provenance,
    target: cst.CSTNode | None,
    value: cst.BaseExpression | None,
    site: Site,
    *,
    gate_field: str | None = None,
) -> tuple[str, cst.BaseExpression] | None:
    """``(name, borrowed)`` when ``target = value`` sets a dtype named for the gate cache to
    ``borrowed``, the dtype of another setting (``self.dtype``, ``cache_dtype``; also as the
    fallback of ``.get(key, fallback)``, a branch of a conditional or of ``or``), which is not
    provably float32; None otherwise. ``gate_field``: instead of ``target``, the field of a
    record of ring dtypes that holds the gate ring's (:mod:`.dtype_records`)."""
    if value is None:
        return None
    name = gate_field
    if name is None:
        name = binding_name(target) if isinstance(target, (cst.Name, cst.Attribute)) else None
        if name is None or not prov.index.gate_caches.names_gate_dtype(name):
            return None
    for borrowed in _choices(value):
        if isinstance(borrowed, cst.Subscript):
            if _narrower_entry_of_a_table(prov, borrowed, site):
                return name, borrowed
            continue
        other = binding_name(borrowed) if isinstance(borrowed, (cst.Name, cst.Attribute)) else None
        if other is None or other == name or not _names_a_dtype(prov, other):
            continue
        if _of_the_gate(prov, borrowed):
            continue  # `ctx.g_dtype = g.dtype`: the gate tensor's own dtype, kept to cast back
        if _reads_a_gate_setting(prov, borrowed):
            continue  # `CacheDtype(args.logdecay_cache_dtype).torch_dtype`: the gate's own
        facts = prov.dtype_facts(borrowed, site)
        if facts and not all(f.is_float32 for f in facts):
            return name, borrowed
    return None


def _narrower_entry_of_a_table(prov: Provenance, lookup: cst.Subscript, site: Site) -> bool:
    """``TORCH_DTYPE_BY_NAME[self.config.cache_precision]``: an entry of a string-to-dtype
    table (named for dtypes, or holding one narrower than float32) looked up by a setting that
    is not the gate's own (no gate word in its name)."""
    if not isinstance(lookup.value, (cst.Name, cst.Attribute)) or len(lookup.slice) != 1:
        return False
    index = lookup.slice[0].slice
    if not isinstance(index, cst.Index) or not isinstance(index.value, (cst.Name, cst.Attribute)):
        return False
    key = binding_name(index.value) or ""
    if set(key.lower().split("_")) & _GATE_WORDS or prov.index.gate_caches.matches(key):
        return False
    table = binding_name(lookup.value) or ""
    if "dtype" in table.lower():
        return True  # `TORCH_DTYPE_BY_NAME`: a table of dtypes, whatever its entries
    facts = prov.dtype_facts(lookup, site)
    return bool(facts) and any(f.dtype in _NARROWER for f in facts)


_NARROWER = frozenset({"float16", "bfloat16"})


def _choices(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The expressions ``value`` may evaluate to, as far as a dtype setting goes."""
    if isinstance(value, cst.IfExp):
        return [*_choices(value.body), *_choices(value.orelse)]
    if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
        return [*_choices(value.left), *_choices(value.right)]
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "get"
        and len(value.args) == 2
        and not any(arg.star or arg.keyword for arg in value.args)
    ):
        return _choices(value.args[1].value)  # the fallback of a table lookup
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value == "getattr"
        and len(value.args) == 3
        and not any(arg.star or arg.keyword for arg in value.args)
    ):
        return _choices(value.args[2].value)  # `getattr(args, "gate_dtype", args.cache_dtype)`
    return [value]


def chosen_by_gate_setting(prov: Provenance, dtypes: Iterable[DtypeFact]) -> bool:
    """Whether every dtype of ``dtypes`` that is not float32 is picked by a setting of the
    gate's own (``TABLE[opt.decay_dtype]``, ``str2dtype(cfg.gate_dtype)`` passed for it): the
    choice is that setting's, judged where the setting is declared and set."""
    narrow = [fact for fact in dtypes if not fact.is_float32]
    return bool(narrow) and all(
        _picked_by_gate_setting(prov, fact.node) or _passed_picked(prov, fact) for fact in narrow
    )


def _passed_picked(prov: Provenance, fact: DtypeFact) -> bool:
    """Whether the call that passes ``fact`` for its parameter passes a value a gate setting
    picks (``Cache(decay_dtype=str2dtype(opt.decay_dtype))``)."""
    call, parameter = fact.passed_by, fact.parameter
    if call is None or not parameter:
        return False
    return any(
        arg.keyword is not None
        and arg.keyword.value == parameter
        and _picked_by_gate_setting(prov, arg.value)
        for arg in call.args
    )


def _picked_by_gate_setting(prov: Provenance, node: cst.BaseExpression) -> bool:
    """``TABLE[opt.decay_dtype]`` or ``str2dtype(opt.decay_dtype)``: the setting alone picks it
    (a call given anything else, ``resolve(cfg.decay_dtype, plan)``, may pick another)."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        picked = index.value if isinstance(index, cst.Index) else None
    elif isinstance(node, cst.Call) and len(node.args) == 1 and not node.args[0].star:
        picked = node.args[0].value
    else:
        return False
    if not isinstance(picked, (cst.Name, cst.Attribute)):
        return False
    name = binding_name(picked) or ""
    return prov.index.gate_caches.names_gate_dtype(name)


def _reads_a_gate_setting(prov: Provenance, borrowed: cst.BaseExpression) -> bool:
    """Whether ``borrowed`` reads, inside, a setting of the gate's own (``logdecay_cache_dtype``
    in ``CacheDtype(args.logdecay_cache_dtype).torch_dtype``)."""
    for node in descendants(borrowed):
        if node is borrowed or not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        name = binding_name(node) or ""
        words = name.lower().split("_")
        if name.lower().endswith("dtype") and any(
            w in _GATE_WORDS or w.endswith("decay") for w in words
        ):
            return True
    return False


def _of_the_gate(prov: Provenance, borrowed: cst.BaseExpression) -> bool:
    """``g.dtype``, ``log_decay.dtype``: the dtype of a tensor named for the gate itself."""
    if not isinstance(borrowed, cst.Attribute) or not isinstance(borrowed.value, cst.Name):
        return False
    owner = borrowed.value.value
    return owner.lower() in _GATE_WORDS or prov.index.gate_caches.matches(owner)


def _names_a_dtype(prov: Provenance, name: str) -> bool:
    """``dtype``, ``cache_dtype``, ``self.torch_dtype``: a dtype setting not for the gate cache,
    nor one float32 by its role (``state_dtype``)."""
    core = name.lower().lstrip("_")
    if core != "dtype" and not core.endswith("_dtype"):
        return False
    words = set(core.split("_"))
    if words & (_FLOAT32_ROLES | _GATE_WORDS):
        return False  # float32 by its role, or a gate's own setting (`replay_gate_dtype`)
    names = prov.index.gate_caches
    return not names.names_gate_dtype(name) and not names.matches(core.removesuffix("_dtype"))


def _varying_with(loop: cst.CSTNode, variables: set[str]) -> set[str]:
    """``variables`` and the names ``loop`` binds to values that read one of them, transitively."""
    assignments: list[tuple[set[str], set[str]]] = []  # (names bound, names read)
    for node in descendants(loop):
        if isinstance(node, cst.Assign):
            targets, value = [target.target for target in node.targets], node.value
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        bound = {
            n.value for t in targets if isinstance(t, (cst.Name, cst.Tuple)) for n in read_names(t)
        }
        assignments.append((bound, {n.value for n in read_names(value)}))
    varying = set(variables)
    while True:
        more = {n for bound, read in assignments if read & varying for n in bound} - varying
        if not more:
            return varying
        varying |= more


def looked_up_by(
    fact: TensorFact, target: cst.BaseExpression, loop: cst.CSTNode | None = None
) -> bool:
    """Whether every dtype of ``fact`` is an unknown entry looked up by a variable of the loop
    target ``target`` (``dtypes[name]`` in ``for name, buf in ...``), an unknown result of a
    call given one (``dtype_for(name, config)``), or the dtype of a tensor it names
    (``tensor.dtype``): each cache gets its own dtype, not one shared
    by all (an entry the analysis reads is judged as it is). Names the body of ``loop`` binds
    to values that read such a variable (``key = f"{prefix}.{name}"``) vary with it too."""
    variables = {name.value for name in read_names(target)}
    if loop is not None:
        variables = _varying_with(loop, variables)

    def keyed(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Subscript):
            keys: list[cst.CSTNode] = [node.slice[0].slice]
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "get"
            and node.args
        ):
            keys = [node.args[0].value]  # `dtypes.get(name, default)`
        elif isinstance(node, cst.Call):
            keys = [arg.value for arg in node.args]  # `dtype_for(name, config)`
        elif isinstance(node, cst.Attribute) and node.attr.value == "dtype":
            keys = [node.value]  # `tensor.dtype` of the tensor the iteration copies
        else:
            return False
        return any(name.value in variables for key in keys for name in read_names(key))

    return bool(fact.dtypes) and all(d.dtype is None and keyed(d.node) for d in fact.dtypes)
