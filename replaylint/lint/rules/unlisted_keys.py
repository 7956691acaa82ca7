"""RL006's loops that fill a mapping under keys the analysis cannot list, which the code then uses
as holding the gate cache.

``for name, shape in spec.ring_shapes(n).items(): rings[name] = torch.zeros(shape, dtype=dtype)``
gives every entry one dtype, but the keys come from somewhere the analysis cannot read. How the
mapping is used afterwards says whether the gate cache is among them: read under a gate-cache key
(``rings["g_cache"]``, ``rings.get("g_cache")``, ``"g_cache" in rings``) or spread into a record
or a decode entry point with a gate-cache field (``LayerRings(**rings)``, also a dict
comprehension spread there directly: ``LayerRings(**{k: t.to(dtype) for k, t in
layer.items()})``). A mapping whose gate
entry is written under its own key as well (before or after the loop) is not judged here: which
of the two writes wins is the code's business, and the explicit one is checked on its own.

The loop is then judged as if it ran once with its key variable holding the gate key, so the
write's enclosing ``if`` tests still decide (``if name != "g_cache":`` leaves it out), and the
fix is the loop's conditional one (``torch.float32 if name == "g_cache" else dtype``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.conditions import leaves_out
from replaylint.lint.dataflow.held_gate_attributes import held_gate_attributes
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.records import positional_fields
from replaylint.lint.dataflow.strings import Iteration
from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.syntax.nodes import binding_name, dotted_name, name_attribute, string_key
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import ancestors, branch_tests, descendants

__all__ = [
    "UNLISTED_INVALID",
    "UNLISTED_VALID",
    "gate_attributes_read",
    "gate_bound_keys",
    "gate_keys_read",
    "spread_iterations",
    "unlisted_iterations",
]

_KEYED_READS = frozenset({"get", "pop"})


def unlisted_iterations(
    context: FileContext,
    key: cst.BaseExpression,
    mapping: cst.BaseExpression,
    loop: cst.CSTNode,
    loop_target: cst.BaseExpression,
    site: Site,
    *,
    attributes: bool = False,
) -> list[Iteration] | None:
    """One iteration per gate-cache key the code uses ``mapping`` as holding, with the loop
    variable ``key`` holding it, for ``mapping[key] = ...`` in ``loop`` whose keys cannot be
    listed; None when ``key`` is not a loop variable or no such use decides. ``attributes``:
    for ``setattr(mapping, key, ...)``, the gate-cache attributes the module reads on it."""
    variable = _key_variable(key, loop_target)
    if variable is None:
        return None
    if not isinstance(mapping, (cst.Name, cst.Attribute)):
        return None
    gates = (
        gate_attributes_read(context, mapping, site)
        | held_gate_attributes(context.provenance, context.gate_caches, mapping, site)
        if attributes
        else gate_keys_read(context, mapping, site)
    )
    if not gates:
        return None
    prov = context.provenance
    result: list[Iteration] = []
    for gate in sorted(gates):
        env: Iteration = {variable: gate}
        if site.statement is not None and _excluded(prov, loop, site, site.statement, env):
            continue
        result.append(env)
    return result or None


def spread_iterations(
    context: FileContext, comprehension: cst.DictComp, site: Site
) -> list[Iteration] | None:
    """For ``Rings(**{name: t.to(dtype) for name, t in layer.items()})`` (a record, or a decode
    entry point, filled from a dict comprehension whose keys cannot be listed): one iteration
    per gate-cache field the call fills from it, with the key variable holding that field's
    name; None when the comprehension is spread into no such call."""
    variable = _key_variable(comprehension.key, comprehension.for_in.target)
    if variable is None or site.statement is None:
        return None
    call = next(
        (
            node
            for node in descendants(site.statement)
            if isinstance(node, cst.Call)
            and any(arg.star == "**" and arg.value is comprehension for arg in node.args)
        ),
        None,
    )
    if call is None:
        return None
    if _decided_by_a_call(comprehension.value, variable):
        return None  # `dtype if recast(name) else t.dtype`: which entries it casts is not read
    gates = _spread_fields(context, call, "", site)
    return [{variable: gate} for gate in sorted(gates)] or None


def _decided_by_a_call(value: cst.BaseExpression, variable: str) -> bool:
    """Whether a conditional in ``value`` tests a call that is handed the key variable."""
    return any(
        isinstance(node, cst.IfExp)
        and any(
            isinstance(call, cst.Call)
            and any(isinstance(n, cst.Name) and n.value == variable for n in descendants(call))
            for call in descendants(node.test)
        )
        for node in descendants(value)
    )


def gate_keys_read(context: FileContext, mapping: cst.Name | cst.Attribute, site: Site) -> set[str]:
    """The gate-cache keys the code uses ``mapping`` (a local, or an attribute) as holding,
    less those it writes under their own key (see the module docstring): a local's function
    decides, an attribute's class (or module)."""
    scope: cst.CSTNode = site.scope
    if isinstance(mapping, cst.Attribute):
        scope = site.enclosing_class() or context.module
    written = context.module.code_for_node(mapping)
    if written not in _used_mappings(context):
        return set()  # the text never keys, tests or spreads it: no walk of the scope
    key = ("gate-keys", id(scope))
    uses = context.memo.get(key)
    if not isinstance(uses, _KeyUses):
        uses = context.memo[key] = _key_uses(context, scope)
    read = set(uses.read.get(written, ()))
    for call in uses.spreads.get(written, ()):
        read |= _spread_fields(context, call, written, site)
    return read - uses.assigned.get(written, set())


def gate_attributes_read(
    context: FileContext, holder: cst.Name | cst.Attribute, site: Site
) -> set[str]:
    """The gate-cache attributes the module reads on an object spelled like ``holder``
    (``engine.log_decay_cache[i]`` after ``setattr(engine, name, ...)`` in a loop), less those
    the loop's function assigns by name (``engine.log_decay_cache = ...``): set by name in
    the loop, read by name elsewhere."""
    written = context.module.code_for_node(holder)
    if not _DOTTED.fullmatch(written):
        return set()
    source = context.source if context.source is not None else context.module.code
    pattern = re.compile(rf"(?<![\w.]){re.escape(written)}\.([A-Za-z_]\w*)(\s*=(?!=))?")
    read: set[str] = set()
    for match in pattern.finditer(source):
        name = match.group(1)
        if context.gate_caches.matches(name) and match.group(2) is None:
            read.add(name)
    function = context.module.code_for_node(site.scope) if site.scope is not context.module else ""
    assigned = {m.group(1) for m in pattern.finditer(function) if m.group(2) is not None}
    return read - assigned


# a dotted name keyed by a string, read with `.get`/`.pop`, spread, or tested with `in`
_USED = re.compile(
    r"""([A-Za-z_][\w.]*)(?:\[\s*["']|\.get\(|\.pop\()|\*\*([A-Za-z_][\w.]*)|\bin\s+([A-Za-z_][\w.]*)"""
)


def _used_mappings(context: FileContext) -> frozenset[str]:
    """The dotted names the file's text uses as mappings that way, read in one pass: a mapping
    spelled otherwise (``self.rings[layer]``) is always looked for in the tree."""
    key = ("used-mappings", 0)
    found = context.memo.get(key)
    if not isinstance(found, frozenset):
        source = context.source if context.source is not None else context.module.code
        names = {name for match in _USED.finditer(source) for name in match.groups() if name}
        found = context.memo[key] = _AnySpelling(names)
    return found


class _AnySpelling(frozenset[str]):
    """Names found in the text; a spelling that is no dotted name counts as found."""

    def __contains__(self, written: object) -> bool:
        if isinstance(written, str) and not _DOTTED.fullmatch(written):
            return True
        return frozenset.__contains__(self, written)


_DOTTED = re.compile(r"[A-Za-z_][\w.]*")


@dataclass
class _KeyUses:
    """Per mapping (as spelled), the gate-cache keys a scope reads and writes it under, and the
    calls that spread it (``**rings``), found in one walk of the scope."""

    read: dict[str, set[str]] = field(default_factory=dict)
    assigned: dict[str, set[str]] = field(default_factory=dict)
    spreads: dict[str, list[cst.Call]] = field(default_factory=dict)
    bound: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per mapping, the keys read into a gate cache (``self.g_cache = rings["gate"]``) and
    that gate cache's name."""


def _key_uses(context: FileContext, scope: cst.CSTNode) -> _KeyUses:
    module, gate_caches = context.module, context.gate_caches
    uses = _KeyUses()
    targets: set[int] = set()
    guarded: set[int] = set()  # `if "g" not in rings: rings["g"] = ...` fills a missing entry
    nodes = list(descendants(scope))
    for node in nodes:
        if isinstance(node, cst.Assign):
            targets.update(id(t.target) for t in node.targets)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            targets.add(id(node.target))
        elif isinstance(node, cst.If) and _membership(node.test) is not None:
            guarded.update(id(n) for n in descendants(node.body))
    for node in nodes:
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            gate = binding_name(node.targets[0].target)
            read_key = _read_key(node.value)
            if gate is not None and gate_caches.matches(gate) and read_key is not None:
                spelled = module.code_for_node(read_key[0])
                uses.bound.setdefault(spelled, {}).setdefault(read_key[1], gate)
        if isinstance(node, cst.Subscript):
            found = string_key(node)
            if found is None or not gate_caches.matches(found):
                continue
            spelled = module.code_for_node(node.value)
            if id(node) not in targets:
                uses.read.setdefault(spelled, set()).add(found)
            elif id(node) not in guarded:
                uses.assigned.setdefault(spelled, set()).add(found)
        elif isinstance(node, cst.Comparison):
            found_in = _membership(node)
            if found_in is not None and gate_caches.matches(found_in[0]):
                spelled = module.code_for_node(found_in[1])
                uses.read.setdefault(spelled, set()).add(found_in[0])
        elif isinstance(node, cst.Call):
            read = _read_key(node)
            if read is not None and gate_caches.matches(read[1]):
                uses.read.setdefault(module.code_for_node(read[0]), set()).add(read[1])
            for arg in node.args:
                if arg.star == "**":
                    spelled = module.code_for_node(arg.value)
                    uses.spreads.setdefault(spelled, []).append(node)
    return uses


def _read_key(value: cst.BaseExpression) -> tuple[cst.BaseExpression, str] | None:
    """``(rings, "gate")`` of ``rings["gate"]``, ``rings.pop("gate")`` or ``rings.get("gate")``."""
    if isinstance(value, cst.Subscript):
        key = string_key(value)
        return None if key is None else (value.value, key)
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _KEYED_READS
        and value.args
        and isinstance(value.args[0].value, cst.SimpleString)
    ):
        read = value.args[0].value.evaluated_value
        return (value.func.value, read) if isinstance(read, str) else None
    return None


def gate_bound_keys(context: FileContext, mapping: str, site: Site) -> dict[str, str]:
    """The keys of the local dict ``mapping`` that the function reads into a gate cache
    (``self.g_cache = rings["gate"]``: ``{"gate": "g_cache"}``), whatever they are called."""
    key = ("gate-keys", id(site.scope))
    uses = context.memo.get(key)
    if not isinstance(uses, _KeyUses):
        uses = context.memo[key] = _key_uses(context, site.scope)
    return uses.bound.get(mapping, {})


def _membership(test: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """``("g", rings)`` of ``"g" in rings`` or ``"g" not in rings``."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    comparison = test.comparisons[0]
    left = test.left
    if not isinstance(comparison.operator, (cst.In, cst.NotIn)):
        return None
    if not isinstance(left, cst.SimpleString) or not isinstance(left.evaluated_value, str):
        return None
    return left.evaluated_value, comparison.comparator


def _spread_fields(context: FileContext, call: cst.Call, written: str, site: Site) -> set[str]:
    """The gate-cache fields ``Rings(**rings)`` (a record) or a decode entry point fills from
    the mapping spelled ``written``, less those the call passes by keyword."""
    gate_caches = context.gate_caches
    func = call.func
    named = {a.keyword.value for a in call.args if a.keyword is not None}
    called = dotted_name(func) or ""
    entry = {
        e.parameter
        for e in context.entry_points
        if called and any(e.matches(n) for n in {called} | context.qualified_names(func))
    }
    # a record class is named in CapWords: other calls are not resolved (it costs a lookup
    # through the project for every `f(**kwargs)`)
    record = called.rpartition(".")[2][:1].isupper()
    fields = (positional_fields(context.provenance, call, site) if record else None) or []
    candidates = entry | {name for name, _ in fields if gate_caches.matches(name)}
    return {name for name in candidates if name not in named}


def _excluded(
    prov: Provenance, loop: cst.CSTNode, site: Site, statement: cst.CSTNode, env: Iteration
) -> bool:
    """Whether an ``if`` between ``loop`` and ``statement`` leaves the iteration ``env`` out."""
    return leaves_out(prov, branch_tests([*ancestors(loop, statement), statement]), site, env)


def _key_variable(key: cst.BaseExpression, loop_target: cst.BaseExpression) -> str | None:
    """``name`` of ``for name, t in ...``, or ``entry.name`` of ``for entry in meta.entries``
    (an attribute of the loop variable holds the key); None for anything else."""
    names = _names(loop_target)
    if isinstance(key, cst.Name):
        return key.value if key.value in names else None
    if isinstance(key, cst.Attribute) and isinstance(key.value, cst.Name):
        return name_attribute(key) if key.value.value in names else None
    return None


def _names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _names(e.value)}
    return set()


UNLISTED_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        # the gate entry is made again, in float32, after the loop
        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            rings["g_cache"] = torch.zeros(spec.ring_shapes(n)["g_cache"], dtype=torch.float32)
            return rings["g_cache"]
        """,
    ),
    Valid(
        """
        import torch

        # the loop gives the gate entry its own float32 dtype
        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                if name != "g_cache":
                    rings[name] = torch.zeros(shape, dtype=dtype)
                else:
                    rings[name] = torch.zeros(shape, dtype=torch.float32)
            return rings["g_cache"]
        """,
    ),
    Valid(
        """
        import torch

        # nothing says the keys include a gate cache
        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            return rings["d_cache"]
        """,
    ),
)

UNLISTED_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            return rings["d_cache"], rings["g_cache"]
        """,
        expected_fix="""
        import torch

        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=torch.float32 if name == "g_cache" else dtype)
            return rings["d_cache"], rings["g_cache"]
        """,
        message_contains="by a loop over `spec.ring_shapes(n).items()`",
    ),
    Invalid(
        """
        from dataclasses import dataclass

        import torch

        @dataclass
        class LayerRings:
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def new_layer(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.empty(shape, dtype=dtype)
            return LayerRings(**rings)
        """,
        expected_fix="""
        from dataclasses import dataclass

        import torch

        @dataclass
        class LayerRings:
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def new_layer(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.empty(shape, dtype=torch.float32 if name == "g_cache" else dtype)
            return LayerRings(**rings)
        """,
        message_contains="gate cache `g_cache` is allocated by a loop",
    ),
    Invalid(
        """
        import torch

        def adopt(payload):
            rings = {}
            for name, blob in payload.items():
                rings[name] = torch.frombuffer(bytearray(blob), dtype=torch.float16)
            if "g_cache" not in rings:
                rings["g_cache"] = torch.zeros(1, dtype=torch.float32)
            return rings
        """,
        expected_fix="""
        import torch

        def adopt(payload):
            rings = {}
            for name, blob in payload.items():
                rings[name] = torch.frombuffer(bytearray(blob), dtype=torch.float16).to(torch.float32) if name == "g_cache" else torch.frombuffer(bytearray(blob), dtype=torch.float16)
            if "g_cache" not in rings:
                rings["g_cache"] = torch.zeros(1, dtype=torch.float32)
            return rings
        """,
        message_contains="raw bytes read as `torch.float16`",
    ),
    Invalid(
        """
        import torch

        class Pool:
            def grow(self, shapes, dtype):
                for kind, rings in zip(("d", "k", "g"), (self.d_cache, self.k_cache, self.g_cache)):
                    rings.append(torch.zeros(shapes[kind], dtype=dtype))
        """,
        expected_fix="""
        import torch

        class Pool:
            def grow(self, shapes, dtype):
                for kind, rings in zip(("d", "k", "g"), (self.d_cache, self.k_cache, self.g_cache)):
                    rings.append(torch.zeros(shapes[kind], dtype=torch.float32 if kind == "g" else dtype))
        """,
        message_contains="allocated by a loop over `zip(",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class LayerCache(NamedTuple):
            ssm_state: torch.Tensor
            d_cache: torch.Tensor
            g_cache: torch.Tensor

        def narrow(layers, dtype):
            # the record's fields say the gate ring is among the entries
            return [
                LayerCache(**{name: t if name == "ssm_state" else t.to(dtype) for name, t in layer.tensors().items()})
                for layer in layers
            ]
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class LayerCache(NamedTuple):
            ssm_state: torch.Tensor
            d_cache: torch.Tensor
            g_cache: torch.Tensor

        def narrow(layers, dtype):
            # the record's fields say the gate ring is among the entries
            return [
                LayerCache(**{name: t if name == "ssm_state" else t.to(torch.float32 if name == "g_cache" else dtype) for name, t in layer.tensors().items()})
                for layer in layers
            ]
        """,
        message_contains="cast by a comprehension over `layer.tensors().items()`",
    ),
)
