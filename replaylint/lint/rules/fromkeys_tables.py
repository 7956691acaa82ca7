"""RL006's dtype tables made by ``dict.fromkeys``: ``dict.fromkeys(RINGS, dtype)`` gives every
cache named in ``RINGS``, the gate cache among them, the one dtype ``dtype``.

Such a table is reported at its value when the gate cache's entry is not provably float32 and
nothing sets that entry apart: a later key of the same dict literal (``{**dict.fromkeys(RINGS,
dtype), "g_cache": torch.float32}``), or, for a table bound to a local, a write of that entry in
the same scope (``dtypes["g_cache"] = torch.float32``; a table passed on or changed in ways not
followed is left alone). The fix adds the float32 gate entry after the shared ones, which leaves
every other entry, and the order of the keys, as it was.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.containers import fromkeys_parts, listed_names
from replaylint.lint.dataflow.facts import TensorFact
from replaylint.lint.dataflow.kwargs import mapping_writes
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.fixes.drafts import EditDraft, FixDraft, InsertAfter, Replace
from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.wording import WHY, named_gate_cache
from replaylint.lint.syntax.nodes import literal_string, one_line
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants


def fromkeys_table_findings(
    context: FileContext,
    prov: Provenance,
    value: cst.BaseExpression,
    site: Site,
    bound_to: cst.Name | None = None,
) -> list[HelperFinding]:
    """The findings for ``value``, a ``dict.fromkeys(...)`` call or a dict literal that spreads
    one (``bound_to``: the local it is assigned to, whose later writes count)."""
    found: list[HelperFinding] = []
    if isinstance(value, cst.Call) and fromkeys_parts(value):
        found.extend(_table(context, prov, value, site, set(), bound_to, standalone=True))
    elif isinstance(value, cst.Dict):
        for position, element in enumerate(value.elements):
            if (
                isinstance(element, cst.StarredDictElement)
                and isinstance(element.value, cst.Call)
                and fromkeys_parts(element.value)
            ):
                later = value.elements[position + 1 :]
                if any(isinstance(e, cst.StarredDictElement) for e in later):
                    continue  # a later spread may set the gate entry
                keys = {literal_string(e.key) for e in later if isinstance(e, cst.DictElement)}
                found.extend(
                    _table(context, prov, element.value, site, keys, None, standalone=False)
                )
    return found


def _table(
    context: FileContext,
    prov: Provenance,
    call: cst.Call,
    site: Site,
    set_apart: set[str | None],
    bound_to: cst.Name | None,
    *,
    standalone: bool,
) -> list[HelperFinding]:
    names_node, shared = call.args[0].value, call.args[1].value
    if to_argument_role(prov, shared, site) != "dtype":
        return []  # `dict.fromkeys(RINGS, 0)`: no dtype table
    gates = [
        name
        for name in listed_names(prov, names_node, site) or ()
        if context.gate_caches.matches(name) and name not in set_apart
    ]
    if bound_to is not None:
        gates = [name for name in gates if not _written(site, bound_to, name)]
    if not gates:
        return []
    dtypes = prov.dtype_facts(shared, site)
    if all(fact.is_float32 for fact in dtypes):
        return []
    module = context.module
    literals = sorted({f.dtype for f in dtypes if f.dtype is not None and not f.is_float32})
    shown = " or ".join(f"torch.{d}" for d in literals) or f"`{one_line(module, shared)}`"
    judged = "" if literals else ", which is not provably float32"
    subject = named_gate_cache(context.gate_caches, gates[0])
    message = (
        f"{subject} gets {shown} from `dict.fromkeys({one_line(module, names_node)}, ...)`, "
        f"a dtype table that gives every cache named in it one dtype{judged}; {WHY}"
    )
    return [HelperFinding(shared, message, _fix(context, call, site, gates, standalone))]


def shared_by_a_table(prov: Provenance, fact: TensorFact) -> bool:
    """Whether every dtype of ``fact`` is the shared value of a ``dict.fromkeys`` table of the
    module (``dtype=dtypes[name]`` of ``dtypes = dict.fromkeys(RINGS, dtype)``): reported where
    the table is made, once."""
    values = prov.index.memo.get(_SHARED_VALUES)
    if values is None:
        values = prov.index.memo[_SHARED_VALUES] = {
            id(node.args[1].value)
            for node in descendants(prov.index.module)
            if isinstance(node, cst.Call) and fromkeys_parts(node)
        }
    return bool(fact.dtypes) and all(id(dtype.node) in values for dtype in fact.dtypes)


_SHARED_VALUES = ("fromkeys shared values", 0)


def _written(site: Site, table: cst.Name, key: str) -> bool:
    """Whether the scope writes ``table[key]`` (or changes the table in ways not followed)."""
    return next(mapping_writes(site.scope, table.value, table, key), None) is not None


def _fix(
    context: FileContext, call: cst.Call, site: Site, gates: list[str], standalone: bool
) -> FixDraft | None:
    """``{**dict.fromkeys(...), "g_cache": torch.float32}`` for a table of its own; the gate
    entry right after the spread in a dict literal that spreads one."""
    torch = context.spelling.torch_at(site)
    if torch is None:
        return None
    spelling = torch.attribute("float32")
    entries = ", ".join(f'"{name}": {spelling}' for name in dict.fromkeys(gates))
    edit: EditDraft
    if standalone:
        edit = Replace(call, f"{{**{one_line(context.module, call, 10_000)}, {entries}}}")
    else:
        edit = InsertAfter(call, f", {entries}")
    return FixDraft(f"Give the gate cache a float32 entry ({entries})", (edit,))


# RL006's examples of `dict.fromkeys` tables (its docs and tests, with the rest of its examples)
FROMKEYS_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def ring_dtypes(dtype):
            # the gate entry set apart after the shared ones
            dtypes = dict.fromkeys(RINGS, dtype)
            dtypes["g_cache"] = torch.float32
            return dtypes
        """
    ),
    Valid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def ring_dtypes(dtype):
            return {**dict.fromkeys(RINGS, dtype), "g_cache": torch.float32}
        """
    ),
    Valid(
        """
        RINGS = ("d_cache", "k_cache", "g_cache")

        def fill_counts():
            return dict.fromkeys(RINGS, 0)  # no dtype table
        """
    ),
)
FROMKEYS_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        class ReplayCache:
            BUFFERS = ("state", "d_cache", "k_cache", "g_cache")

        def host_dtypes(cache_dtype):
            dtypes = dict.fromkeys(ReplayCache.BUFFERS, cache_dtype)
            dtypes["state"] = torch.float32  # the gate entry keeps `cache_dtype`
            return dtypes
        """,
        expected_fix="""
        import torch

        class ReplayCache:
            BUFFERS = ("state", "d_cache", "k_cache", "g_cache")

        def host_dtypes(cache_dtype):
            dtypes = {**dict.fromkeys(ReplayCache.BUFFERS, cache_dtype), "g_cache": torch.float32}
            dtypes["state"] = torch.float32  # the gate entry keeps `cache_dtype`
            return dtypes
        """,
        message_contains="from `dict.fromkeys(ReplayCache.BUFFERS, ...)`, a dtype table",
    ),
    Invalid(
        """
        import torch

        FLOAT_BUFFERS = ("d_cache", "k_cache", "g_cache")

        def kv_cache_dtypes(dtype: torch.dtype):
            return {**dict.fromkeys(FLOAT_BUFFERS, dtype), "write_pos": torch.int32}
        """,
        expected_fix="""
        import torch

        FLOAT_BUFFERS = ("d_cache", "k_cache", "g_cache")

        def kv_cache_dtypes(dtype: torch.dtype):
            return {**dict.fromkeys(FLOAT_BUFFERS, dtype), "g_cache": torch.float32, "write_pos": torch.int32}
        """,
        message_contains="one dtype, which is not provably float32",
    ),
    Invalid(
        """
        import torch

        RINGS = ["d_cache", "k_cache", "g_cache"]
        DTYPES = dict.fromkeys(RINGS, torch.bfloat16)
        """,
        expected_fix="""
        import torch

        RINGS = ["d_cache", "k_cache", "g_cache"]
        DTYPES = {**dict.fromkeys(RINGS, torch.bfloat16), "g_cache": torch.float32}
        """,
        message_contains="gets torch.bfloat16 from",
    ),
)
