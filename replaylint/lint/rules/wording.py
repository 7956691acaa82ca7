"""Wording the rules' messages share, so that every rule says the same thing the same way."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import DtypeFact, Kind, TensorFact
from replaylint.lint.dataflow.given_submodules import GivenHolder
from replaylint.lint.dataflow.imported_modules import ImportedGateBuffer
from replaylint.lint.dataflow.modules import GUARD, ModuleCast
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.syntax.nodes import one_line

FIX_SAFETY = """
**When the fix is safe, unsafe or withheld.** The fix above is offered as safe when it changes
nothing but the gate cache's dtype. It is **unsafe** (applied only with `--unsafe-fixes`) when
the value reaches the gate cache through a local that is also read elsewhere (`ring = ...;
self.g_cache = ring; register(ring)`): the fix then casts where the value becomes the gate cache,
and the cast copies, so the gate cache stops sharing storage with the local's other uses; and when
spelling `torch.float32` needs an `import torch` in a module that does not import torch
unconditionally (only under `if TYPE_CHECKING:`, or nowhere at module level), because the module
would then need torch to import. A value made by a helper, a lambda or a `functools.partial` that
other calls use too is not fixed inside it: the gate cache's call passes `dtype=torch.float32`
(a partial), or its fresh result is cast where it becomes the gate cache
(`self._ring(shape).to(torch.float32)`), which changes nothing the other calls get; when the
helper's result is also kept elsewhere, there is no fix. `torch.float32` is spelled with a name bound to torch where the fix
goes: a function's own `import torch`, an optional import (`try: import torch`), `torch =
pytest.importorskip("torch")`, never an alias the function rebinds (`import torch as t` then `for t
in ...`). The fix is **withheld** (the finding says what to change instead) when the same value is
bound to another cache in the statement (`d_cache = g_cache = torch.zeros(...)`, the walrus form),
or when the gate cache is a view of a buffer that other tensors share (`self.g_cache = buf[1]`),
where a cast would copy it out of the pool. Integer, bool and complex tensors are never reported:
a log-decay ring is floating point, whatever a tensor's name.
"""
"""The fix-safety conditions every gate-cache binding rule shares (rules/base.py: fix_for)."""

ARGUMENT_FIX_SAFETY = """
**When the fix is safe, or withheld.** The fix is offered as safe where the value feeds the gate
argument alone (it is made inline, or the locals it passes through are read nowhere else): only
the gate ring's dtype changes, and the kernel still writes into the tensor the caller holds. It
is withheld when the value is also read elsewhere (`g = torch.zeros(...)` passed as both the d
and the g ring, or kept and returned after the call): changing it where it is made would change
its other uses, and a cast at the call site is a copy — the kernel writes the new gate row into
the copy, so the ring the caller keeps would never advance. The message then names the line to
change. When that line is also a gate-cache binding, RL001-RL005 report it with the same edit,
which is applied once.
"""
"""Why a fix of a decode entry point's gate argument is safe, or withheld (RL007)."""

WHY = "gate caches hold log-decays that are summed and exponentiated, so they must be float32"
"""Why a gate cache must be float32, closing most messages."""


def gate_cache_subject(names: GateCacheNames, binding: GateCacheBinding) -> str:
    """``gate cache `self.g_cache``` plus, for a learned name, the call that taught it."""
    return named_gate_cache(names, binding.name, binding.display)


def named_gate_cache(names: GateCacheNames, name: str, display: str | None = None) -> str:
    """``gate cache `<display>``` plus, for a learned ``name``, the call that taught it."""
    subject = f"gate cache `{display if display is not None else name}`"
    learned = names.learned_from(name)
    if learned is not None:
        subject += f" ({learned.describe()})"
    return subject


def through(context: FileContext, fact: TensorFact) -> str:
    """`` through `ring` (line 12)`` when the fact was reached through local tensor bindings."""
    if not fact.via:
        return ""
    names = ", ".join(
        f"`{binding.name}` (line {context.line_of(binding.node)})" for binding in fact.via
    )
    return f" through {names}"


def describe_dtype(
    context: FileContext,
    expression: cst.CSTNode,
    facts: Iterable[DtypeFact],
    *,
    through_mapping: bool = False,
) -> str:
    """How a non-literal dtype reads, and where it comes from: ``` `ring_dtype` (line 775:
    `conv_dtype if spec else ssm_dtype`)```, ``` `dtype`, a parameter```, and for a ``**``
    mapping (``through_mapping``) ``` `factory_kwargs`, whose `dtype` entry is `dtype`, a
    parameter```."""
    described = f"`{one_line(context.module, expression)}`"
    for fact in facts:
        if fact.dtype is None and fact.passed_by is not None:
            return f"{described}, {_passed(context, fact)}"
        if fact.dtype is not None or fact.binding is None:
            continue
        if through_mapping and fact.node is not expression:
            described += f", whose `dtype` entry is `{one_line(context.module, fact.node)}`"
        binding = fact.binding
        if binding.kind == "param":
            return f"{described}, a parameter"
        if binding.value is not None:
            line = context.line_of(binding.node)
            return f"{described} (line {line}: `{one_line(context.module, binding.value, 50)}`)"
        return described
    return described


def _passed(context: FileContext, fact: DtypeFact) -> str:
    """``a parameter that the call at line 15 passes as `config.gate_dtype` (line 14)``."""
    assert fact.passed_by is not None
    line = context.line_of(fact.passed_by)
    value = f"`{one_line(context.module, fact.node, 50)}`"
    written = context.line_of(_decided_at(fact))
    return f"a parameter that the call at line {line} passes as {value}" + (
        f" (line {written})" if written != line else ""
    )


def _decided_at(fact: DtypeFact) -> cst.CSTNode:
    """Where a passed dtype was decided: the caller's local it came through, or the value."""
    binding = fact.binding
    if binding is not None and binding.kind == "assign":
        return binding.node
    return fact.node


def reported_at(fact: TensorFact, names: GateCacheNames | None = None) -> cst.CSTNode:
    """Where a finding on ``fact`` goes: where the allocation takes its dtype, or, when a dtype
    that is not float32 is one that a call of the module passes for a parameter meant for the
    gate cache, at the first such value: the allocation is right to take a parameter, the
    caller chose the dtype. (The fix stays at the allocation, which then no longer depends on
    its callers.) With the file's gate-cache ``names``, a literal passed for a parameter named for the gate
    cache's dtype is left where it is: RL001 reports that setting where the caller writes it."""
    passed = [
        f
        for f in fact.dtypes
        if not f.is_float32
        and f.passed_by is not None
        and not (names and f.parameter and names.names_gate_dtype(f.parameter))
    ]
    # a value the caller decides goes before one that only passes its own parameter on
    passed.sort(key=lambda f: f.binding is not None and f.binding.kind == "param")
    return _decided_at(passed[0]) if passed else fact.node


def literal_names(dtypes: Iterable[str]) -> str:
    """``torch.bfloat16 or torch.float16``."""
    return " or ".join(f"torch.{dtype}" for dtype in dtypes)


def binding_lines(context: FileContext, facts: Iterable[DtypeFact]) -> str:
    """`` (through `dtype`, line 3)`` for literal dtypes that came through a local variable, and
    `` (from `WIRE_DTYPE` at pkg/policy.py:4)`` for those another module of the project wrote."""
    seen: list[str] = []
    origins: list[str] = []
    for fact in facts:
        text = None
        if fact.passed_by is not None and fact.dtype is not None:
            text = f"`{fact.parameter}`, {_passed(context, fact)}"
        elif fact.binding is not None and fact.dtype is not None:
            text = f"`{fact.binding.name}`, line {context.line_of(fact.binding.node)}"
        if text is not None and text not in seen:
            seen.append(text)
        if fact.origin and fact.dtype is not None and fact.origin not in origins:
            origins.append(fact.origin)
    pieces = [f"through {'; '.join(seen)}"] if seen else []
    return f" ({'; '.join([*pieces, *origins])})" if pieces or origins else ""


def is_spread(fact: TensorFact) -> bool:
    """Whether ``fact`` is about the ``**`` mapping an allocation takes its dtype from."""
    allocation = fact.allocation
    return allocation is not None and any(
        arg.star == "**" and arg.value is fact.node for arg in allocation.call.args
    )


# ------------------------------------------------------------------ module casts (RL004)
def _cast_target(dtypes: tuple[DtypeFact, ...]) -> str:
    literals = sorted({d.dtype for d in dtypes if d.dtype is not None})
    return literal_names(literals) if literals else "a dtype that is not provably float32"


def _guard_advice(owner: str) -> str:
    return (
        f"keep it float32 with `replaylint.guards.{GUARD}` (decorate `{owner}`, or call it "
        "on the module before the cast)"
    )


def module_cast_message(context: FileContext, call: cst.Call, cast: ModuleCast) -> str:
    """A cast of a module class of this module that holds a gate buffer."""
    module, line = context.module, context.line_of(cast.buffer.node)
    target = _cast_target(cast.dtypes)
    owner = cast.buffer.cls.name.value
    written = one_line(module, call)
    advice = _guard_advice(owner)
    if not cast.buffer.held_by or cast.buffer.module is None:
        return (
            f"`{written}` casts every floating buffer of `{owner}` to {target}, its gate cache "
            f"`{cast.buffer.name}` (registered on line {line}) included; {WHY}; {advice}"
        )
    held_by = ", itself held by ".join(f"`{path}`" for path in reversed(cast.buffer.held_by))
    return (
        f"`{written}` casts the gate buffer `{cast.buffer.name}` of "
        f"`{cast.buffer.module.name.value}` (registered on line {line}), held by {held_by}, "
        f"to {target} with every other floating buffer of `{owner}`; {WHY}; {advice}"
    )


def imported_cast_message(
    module: cst.Module, call: cst.Call, buffer: ImportedGateBuffer, dtypes: tuple[DtypeFact, ...]
) -> str:
    """A cast of a module class of another module of the project."""
    where = f"{buffer.origin.path}:{buffer.origin.line}"
    held = (
        ", held by " + ", itself held by ".join(f"`{p}`" for p in reversed(buffer.held_by)) + ","
        if buffer.held_by
        else ""
    )
    return (
        f"`{one_line(module, call)}` casts the gate buffer `{buffer.name}` of `{buffer.owner}` "
        f"(registered at {where}){held} to {_cast_target(dtypes)} with every other floating "
        f"buffer of `{buffer.cls}`; {WHY}; {_guard_advice(buffer.cls)}"
    )


def given_holder_cast_message(
    module: cst.Module,
    call: cst.Call,
    given: GivenHolder,
    line: int,
    where: str,
    dtypes: tuple[DtypeFact, ...],
) -> str:
    """A cast of a module that line ``line`` hands a gate-buffer submodule."""
    receiver = one_line(module, given.assignment.targets[0].target)
    return (
        f"`{one_line(module, call)}` casts every floating buffer of a module to "
        f"{_cast_target(dtypes)}, the gate buffer `{given.buffer}` of the `{given.cls}` that "
        f"line {line} makes `{receiver}` (registered at {where}) included; {WHY}; "
        f"{_guard_advice(given.cls)}"
    )


def unknown_module_cast_message(
    module: cst.Module,
    call: cst.Call,
    holder: str,
    buffer: str,
    where: str,
    dtypes: tuple[DtypeFact, ...],
) -> str:
    """A cast of a module of no known class, in a project whose ``holder`` holds a gate buffer
    (``where``: the line or file and line it is registered on)."""
    return (
        f"`{one_line(module, call)}` casts every floating buffer of a module whose class is not known here to "
        f"{_cast_target(dtypes)}; given a `{holder}` (or a model holding one), that converts the "
        f"gate buffer `{buffer}` registered {where}; {WHY}; keep it float32 with "
        f"`replaylint.guards.{GUARD}` (call it on the module before the cast, or decorate the "
        "gate-buffer class)"
    )


def quoted(value: str) -> str:
    """``value`` as a Python string literal, double-quoted where it can be."""
    return f'"{value}"' if '"' not in value and "\\" not in value else repr(value)


def made_how(fact: TensorFact) -> str:
    """How a loop made a cache: cast, loaded or allocated."""
    return {Kind.CAST: "cast", Kind.LOADED: "loaded"}.get(fact.kind, "allocated")
