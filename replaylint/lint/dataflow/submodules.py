"""Gate buffers held through submodules: ``model.to(torch.bfloat16)`` on the top-level model.

``nn.Module._apply`` (behind ``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.type(...)``)
recurses into every submodule, so casting a model converts the float32 gate buffer that each of
its layers registers. A class *holds* a gate buffer when it registers one
(:func:`.modules.gate_buffer_classes`) or when its instances hold an instance of a class that
does: as an attribute set in any method, inside an ``nn.ModuleList`` / ``nn.ModuleDict`` /
``nn.Sequential`` / list / comprehension, through ``add_module`` or ``setattr``, or through a
base class (:mod:`.instances` reads those forms). :func:`held_gate_buffer` answers it for one
class, given the answer for the classes it names, so it can be asked of an imported class too;
:func:`gate_buffer_holders` asks it of every class of the module.

A class that keeps its gate buffers float32 stops the cast wherever it sits on the path
(:func:`keeps_gate_buffers_float32`): guarded with ``keep_fp32_gate_caches`` or the
``KeepFp32GateCaches`` mixin, or overriding ``_apply`` (or ``to``, ``half``, ``bfloat16``,
``type``) with a body that puts the gate buffers back to float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import libcst as cst

from replaylint.lint.dataflow.instances import chain_root, contained_classes, instance_classes
from replaylint.lint.dataflow.module_classes import (
    ModuleClasses,
    Names,
    attribute_values,
    module_classes,
)
from replaylint.lint.dataflow.modules import (
    GUARD,
    GateBuffer,
    ModuleCast,
    constructing,
    imported_base_keeps,
    keeps_float32,
    module_cast_dtypes,
)
from replaylint.lint.dataflow.new_instances import constructed_here
from replaylint.lint.project.buffer_makers import CONSTRUCTION
from replaylint.lint.syntax.nodes import dotted_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

HeldLookup = Callable[[str], GateBuffer | None]
"""The gate buffer a class (by name) holds, or None."""


@dataclass(frozen=True)
class GateBufferHolders:
    """The module's classes whose instances hold a float32 gate buffer, by name."""

    classes: ModuleClasses
    buffers: dict[str, GateBuffer]


def gate_buffer_holders(
    prov: Provenance, registering: dict[str, GateBuffer], *, kept: bool = True
) -> GateBufferHolders:
    """``registering`` (the classes that register a gate buffer) and the module's classes that
    hold one through submodules, less those that keep their gate buffers float32 (unless not
    ``kept``: a cast of each tensor goes past what a class does in ``_apply``)."""
    if not registering:  # nothing to hold: the module's classes need not be read
        return GateBufferHolders(ModuleClasses({}, {}), {})
    classes = module_classes(prov)
    answers: dict[str, GateBuffer | None] = {}
    asking: set[str] = set()

    def lookup(name: str) -> GateBuffer | None:
        if name in answers:
            return answers[name]
        cls = classes.by_name.get(name)
        if cls is None or name in asking:
            return None  # not a class of the module, or a cycle of attributes
        asking.add(name)
        try:
            answers[name] = held_gate_buffer(
                prov, classes, cls, registering.get(name), lookup, kept=kept
            )
        finally:
            asking.discard(name)
        return answers[name]

    for name in classes.by_name:
        lookup(name)
    return GateBufferHolders(
        classes, {name: buffer for name, buffer in answers.items() if buffer is not None}
    )


def held_gate_buffer(
    prov: Provenance,
    classes: ModuleClasses,
    cls: cst.ClassDef,
    registered: GateBuffer | None,
    lookup: HeldLookup,
    passed: dict[str, Names] | None = None,
    *,
    kept: bool = True,
) -> GateBuffer | None:
    """The float32 gate buffer a cast of a ``cls`` instance converts: the one it registers
    (``registered``), else the first one a submodule holds (``lookup`` answers for the classes
    its attributes are built from; ``passed``, for the classes a construction gives its class
    parameters). None when ``cls`` keeps its gate buffers float32 (and ``kept``)."""
    if kept and keeps_gate_buffers_float32(prov, classes, cls):
        return None
    if registered is not None:
        return registered
    if not classes.is_module(cls):
        return None
    built: set[str] | None = None
    for attribute, value, site in attribute_values(classes, cls):
        for name in contained_classes(prov, classes, value, site, passed):
            held = lookup(name)
            if held is not None:
                made_by = held.made_by
                method = site.scope
                if made_by == CONSTRUCTION and isinstance(method, cst.FunctionDef):
                    built = constructing(prov, cls) if built is None else built
                    if method.name.value not in built:
                        made_by = method.name.value  # `def set_cache(self): self.cache = ...`
                return GateBuffer(
                    cls,
                    held.name,
                    held.node,
                    held.module or held.cls,
                    (f"{cls.name.value}.{attribute}", *held.held_by),
                    made_by,
                )
    return None


def keeps_gate_buffers_float32(prov: Provenance, classes: ModuleClasses, cls: cst.ClassDef) -> bool:
    """Whether ``cls`` (or a base class of the module) is guarded, or overrides a cast method
    of ``nn.Module`` with a body that restores float32 gate buffers: it then decides what a
    cast does to them, here and for every module that holds it."""
    return any(
        keeps_float32(prov, owner) or any(imported_base_keeps(prov, b.value) for b in owner.bases)
        for owner in classes.mro(cls)
    )


def held_module_cast(
    prov: Provenance, call: cst.Call, site: Site, holders: GateBufferHolders
) -> ModuleCast | None:
    """``call`` when it casts (to a dtype not provably float32) a module that is, on some way
    it may have been made, an instance of a class that holds a gate buffer."""
    dtypes = module_cast_dtypes(prov, call, site)
    if dtypes is None or not isinstance(call.func, cst.Attribute):
        return None
    names = instance_classes(prov, holders.classes, call.func.value, site)
    passed = passed_classes(prov, holders.classes, chain_root(call.func.value), site)
    for name in names or ():
        buffer = holders.buffers.get(name)
        if passed and (buffer is None or buffer.held_by):
            # `Stack(..., layer_cls=PinnedLayer)`: what this instance holds, not the class
            cls = holders.classes.by_name[name]
            buffer = held_gate_buffer(prov, holders.classes, cls, None, holders.buffers.get, passed)
        if buffer is not None:
            if buffer.made_by != CONSTRUCTION and constructed_here(
                prov, call.func.value, site, lambda f, _: _names_class(f, holders)
            ):
                continue  # a new instance: the method that makes the buffer has not run
            return ModuleCast(call, buffer, dtypes)
    return None


def passed_classes(
    prov: Provenance, classes: ModuleClasses, receiver: cst.BaseExpression, site: Site
) -> dict[str, Names]:
    """The module classes a construction of ``receiver`` (``Stack(cfg, layer_cls=Pinned)``, or a
    local bound once to one) passes for the parameters of the class's ``__init__``."""
    call: cst.BaseExpression = receiver
    if isinstance(receiver, cst.Name):
        found = prov.lookup(receiver.value, site) or []
        if len(found) != 1 or found[0][0].kind != "assign" or found[0][0].value is None:
            return {}
        call = chain_root(found[0][0].value)
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
        return {}
    cls = classes.by_name.get(call.func.value)
    init = next(
        (
            statement
            for owner in (classes.mro(cls) if cls is not None else ())
            for statement in owner.body.body
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__"
        ),
        None,
    )
    if init is None:
        return {}
    positional = [param.name.value for param in init.params.params[1:]]
    passed: dict[str, Names] = {}
    for place, arg in enumerate(call.args):
        if arg.star:
            break
        name = arg.keyword.value if arg.keyword is not None else None
        if name is None and place < len(positional):
            name = positional[place]
        value = arg.value
        if name is not None and isinstance(value, cst.Name) and value.value in classes.by_name:
            passed[name] = (value.value,)
    return passed


def _names_class(func: cst.BaseExpression, holders: GateBufferHolders) -> bool:
    return isinstance(func, cst.Name) and func.value in holders.classes.by_name


def guarded_instance(prov: Provenance, call: cst.Call, site: Site) -> bool:
    """Whether the module ``call`` casts is guarded as an instance: the cast is wrapped
    (``keep_fp32_gate_caches(model.to(dtype))``), or its scope calls the guard on the cast
    module or on the name the cast's result is bound to (``keep_fp32_gate_caches(model)``,
    before or after the cast), or binds the cast module to the guard's result."""
    if not isinstance(call.func, cst.Attribute):
        return False
    module = prov.index.module
    receiver = call.func.value
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value  # `model.cuda().half()`: the guard names `model`
    names = {_code(module, receiver)}
    if isinstance(site.statement, cst.SimpleStatementLine):
        for small in site.statement.body:  # `model = KimiModel(config).half()`
            if isinstance(small, cst.Assign) and any(n is call for n in _walk(small.value)):
                names.update(_code(module, target.target) for target in small.targets)
    for node in _walk(site.scope):
        if _is_guard_call(node) and node.args:
            guarded = node.args[0].value
            if _code(module, guarded) in names or any(n is call for n in _walk(guarded)):
                return True
        if (  # `model = keep_fp32_gate_caches(KimiModel(config))`: the name holds a guarded one
            isinstance(node, cst.Assign)
            and _is_guard_call(node.value)
            and any(_code(module, target.target) in names for target in node.targets)
        ):
            return True
    return False


def _is_guard_call(node: cst.CSTNode) -> TypeGuard[cst.Call]:
    return isinstance(node, cst.Call) and (dotted_name(node.func) or "").rpartition(".")[2] == GUARD


def _walk(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [root]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(syntax_children(current))


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return " ".join(module.code_for_node(node).split())
