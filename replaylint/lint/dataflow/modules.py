"""Module casts: ``Pool(...).to(torch.bfloat16)`` converts the gate buffer a module registers.

``nn.Module.to(dtype)``, ``.half()``, ``.bfloat16()`` and ``.double()`` cast every floating
parameter and buffer of the module, so a gate cache registered as a float32 buffer turns bf16
when the model is moved "to the model dtype" — the most common way a correct buffer goes wrong.
:func:`gate_buffer_classes` finds the module's classes that register a floating gate buffer
(directly or through a base class of the module; ``register_buffer`` or ``self.g_cache =
nn.Buffer(...)``), and :func:`module_cast` says whether a call casts an instance of one of them
(:mod:`.submodules` adds the classes that hold such an instance as a submodule).
:func:`assigning_load` finds the other way: ``load_state_dict(checkpoint, assign=True)`` keeps
the loaded tensors instead of copying them into the buffers, so the gate buffer takes the dtype
the checkpoint was saved in. (Without ``assign``, loading copies into each buffer and keeps its
dtype: a float32 gate buffer stays float32, a bf16 one rounds the loaded values; that buffer is
reported where it is registered.)
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.allocations import literal_dtype
from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.facts import DtypeFact, Kind, definite_dtype
from replaylint.lint.dataflow.instances import MODULE_CHAIN, instance_classes
from replaylint.lint.dataflow.module_classes import module_classes
from replaylint.lint.dataflow.new_instances import constructed_here
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.torch_api import (
    CAST_METHODS,
    FLOAT32,
    FLOAT32_TENSOR_TYPE,
    FLOAT64,
    NON_FLOATING_DTYPES,
    TENSOR_TYPE_DTYPES,
)
from replaylint.lint.gatecache.bindings import static_name
from replaylint.lint.gatecache.names import DEFAULT_GATE_CACHE_PATTERNS, GateCacheNames
from replaylint.lint.project.buffer_makers import (
    CONSTRUCTION,
    buffer_makers,
    constructing_methods,
)
from replaylint.lint.project.gate_buffers import class_keeps_float32, registers_gate_buffer
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import (
    binding_name,
    dotted_name,
    entries_rewritten,
    is_name,
    keyword_arg,
    literal_string,
    method_name,
    positional_args,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

GUARD = "keep_fp32_gate_caches"
# nn.Module methods a class may override to decide what a cast does to its buffers
_CAST_OVERRIDES = frozenset({"_apply", "to", "half", "bfloat16", "type"})
_GUARD_NAMES = GateCacheNames(DEFAULT_GATE_CACHE_PATTERNS)


def guard_knows(name: str) -> bool:
    """Whether the guard finds a gate cache of this name at run time (its default patterns)."""
    return _GUARD_NAMES.matches(name)


_GUARD_MIXIN = "KeepFp32GateCaches"
# methods of nn.Module that return the module itself, keeping what it holds


@dataclass(frozen=True)
class GateBuffer:
    """A class of the module that registers a floating gate buffer."""

    cls: cst.ClassDef
    """The class whose instances hold the buffer."""
    name: str
    """The gate cache's name."""
    node: cst.CSTNode
    """Where it is registered (the ``register_buffer`` call or the assignment)."""
    module: cst.ClassDef | None = None
    """For a buffer held through submodules: the class that registers it (or inherits it)."""
    held_by: tuple[str, ...] = ()
    """For a buffer held through submodules: the attributes that hold it, outermost first
    (``KimiForCausalLM.model``, ``KimiModel.layers``)."""
    made_by: str = CONSTRUCTION
    """The method that registers it after construction (``setup_cache``), or
    :data:`CONSTRUCTION`: a cast of a new instance converts it only in the second case."""


@dataclass(frozen=True)
class ModuleCast:
    call: cst.Call
    buffer: GateBuffer
    dtypes: tuple[DtypeFact, ...]


_BUFFER_CLASSES = frozenset({"torch.nn.Buffer", "torch.nn.parameter.Buffer"})


def gate_buffer_classes(prov: Provenance, *, kept: bool = True) -> dict[str, GateBuffer]:
    """Classes of the module, by name, that hold a floating gate buffer and are not guarded
    (guarded ones too, unless ``kept``)."""
    source = prov.index.source
    if source is not None and not registers_gate_buffer(source, prov.index.gate_caches.matches):
        return {}  # no gate buffer registered by name: no class to walk
    own: dict[str, GateBuffer] = {}
    classes = {cls.name.value: cls for cls in prov.index.classes()}
    for cls in classes.values():
        found = _registered(prov, cls)
        if found is not None:
            own[cls.name.value] = found
    result: dict[str, GateBuffer] = {}
    for name, cls in classes.items():
        if kept and keeps_float32(prov, cls):
            continue
        buffer = _inherited(prov, name, classes, own, set())
        if buffer is not None:
            result[name] = replace(buffer, cls=cls)  # registered in `cls` or a base class
    return result


def module_cast(
    prov: Provenance, call: cst.Call, site: Site, classes: dict[str, GateBuffer]
) -> ModuleCast | None:
    """``call`` when it casts an instance of one of ``classes`` to a dtype not provably
    float32."""
    dtypes = module_cast_dtypes(prov, call, site)
    if dtypes is None or not isinstance(call.func, cst.Attribute):
        return None
    buffer = _instance_of(prov, call.func.value, site, classes, 0)
    if buffer is None or (
        buffer.made_by != CONSTRUCTION
        and constructed_here(
            prov, call.func.value, site, lambda f, _: isinstance(f, cst.Name) and f.value in classes
        )
    ):
        return None  # not an instance, or a new one that holds no gate buffer yet
    return ModuleCast(call, buffer, dtypes)


def module_cast_dtypes(
    prov: Provenance, call: cst.Call, site: Site
) -> tuple[DtypeFact, ...] | None:
    """The dtypes a module method call (``.to(dtype)``, ``.half()``, ``.type(dtype)``) casts
    every floating buffer to, when one of them may narrow a float32 buffer; None for a device
    move, a float32 cast, and a float64 one (which loses nothing, and the kernel refuses it)."""
    method = method_name(call)
    if method is None or not isinstance(call.func, cst.Attribute):
        return None
    dtypes: tuple[DtypeFact, ...]
    if method in CAST_METHODS:
        dtypes = (DtypeFact(CAST_METHODS[method], call.func.attr),)
    elif method in {"to", "type"}:
        dtype_arg = keyword_arg(call, "dtype" if method == "to" else "dst_type")
        expr = dtype_arg.value if dtype_arg is not None else None
        positional = positional_args(call)
        if method == "type" and expr is None and positional:
            return _type_dtypes(prov, positional[0].value, site)
        like: cst.BaseExpression | None = None
        first: str | None = None  # the first argument's role
        for arg in positional[:2] if method == "to" else ():
            role = to_argument_role(prov, arg.value, site) if expr is None else None
            if role == "unknown" and arg is not positional[0] and first == "device":
                role = "dtype"  # `.to(device, dtype)`: the one place after a device
            first = role if arg is positional[0] else first
            if role == "dtype":
                expr = arg.value
            elif role == "tensor" and like is None and arg is positional[0]:
                like = arg.value  # `pool.to(next(model.parameters()))`: that tensor's dtype
        if expr is None and like is not None:
            facts = prov.tensor_facts(like, site)
            return None if facts and prov.all_float32(facts) else (DtypeFact(None, like),)
        if expr is None:
            return None
        dtypes = prov.dtype_facts(expr, site)
    else:
        return None
    return _narrowing(dtypes)


def _type_dtypes(
    prov: Provenance, target: cst.BaseExpression, site: Site
) -> tuple[DtypeFact, ...] | None:
    """``module.type(torch.bfloat16)``, ``.type(torch.cuda.HalfTensor)`` or ``.type("...")``."""
    name = literal_string(target)
    if name is None and isinstance(target, cst.Attribute) and target.attr.value.endswith("Tensor"):
        name = target.attr.value
    if name is not None:
        tensor_type = name.rpartition(".")[2]
        if tensor_type == FLOAT32_TENSOR_TYPE:
            return None
        return _narrowing((DtypeFact(TENSOR_TYPE_DTYPES.get(tensor_type), target),))
    return _narrowing(prov.dtype_facts(target, site))


def _narrowing(dtypes: tuple[DtypeFact, ...]) -> tuple[DtypeFact, ...] | None:
    kept = {FLOAT32, FLOAT64} | NON_FLOATING_DTYPES
    return None if all(d.dtype in kept for d in dtypes) else dtypes


def assigning_load(
    prov: Provenance, receiver: cst.BaseExpression, site: Site, classes: dict[str, GateBuffer]
) -> GateBuffer | None:
    """The gate buffer of ``receiver.load_state_dict(state, assign=True)`` (a call
    :func:`loads_by_assigning` accepts) when ``receiver`` is an instance of one of ``classes``:
    with ``assign=True`` the module keeps the loaded tensors, in the dtype they were saved with,
    instead of copying them into its buffers (which keeps each buffer's dtype)."""
    if isinstance(receiver, cst.Name) and receiver.value == "self":
        owner = site.enclosing_class()
        return classes.get(owner.name.value) if owner is not None else None
    found = _instance_of(prov, receiver, site, classes, 0)
    if found is None:
        # `layer.cache` of `for layer in model.layers`: what the module's classes build there
        names = instance_classes(prov, module_classes(prov), receiver, site)
        if names and all(name in classes for name in names):
            return classes[names[0]]
    return found


def loads_by_assigning(prov: Provenance, call: cst.Call, site: Site) -> bool:
    """Whether ``call`` is ``module.load_state_dict(state, assign=True)`` of a ``state`` read
    from disk whose entries the scope does not replace first."""
    if method_name(call) != "load_state_dict" or not isinstance(call.func, cst.Attribute):
        return False
    assign = keyword_arg(call, "assign")
    if assign is None or not _true(prov, assign.value, site):
        return False
    positional = positional_args(call)
    state = positional[0] if positional else keyword_arg(call, "state_dict")
    if state is None or not prov.is_loaded(state.value, site):
        return False
    # entries replaced before the load (`sd["g_cache"] = sd["g_cache"].float()`)
    return not (
        isinstance(state.value, cst.Name) and entries_rewritten(site.scope, state.value.value)
    )


def _true(prov: Provenance, expr: cst.BaseExpression, site: Site) -> bool:
    """``True``, or a parameter that defaults to it (``def restore(..., assign: bool = True)``)
    and is never rebound."""
    if not isinstance(expr, cst.Name):
        return False
    if expr.value == "True":
        return True
    found = prov.lookup(expr.value, site, NO_ENV)
    return bool(found) and all(
        binding.kind == "param"
        and isinstance(binding.node, cst.Param)
        and isinstance(binding.node.default, cst.Name)
        and binding.node.default.value == "True"
        for binding, _ in found or ()
    )


_COPIES = frozenset({"copy.deepcopy", "copy.copy"})


def _instance_of(
    prov: Provenance,
    expr: cst.BaseExpression,
    site: Site,
    classes: dict[str, GateBuffer],
    depth: int,
) -> GateBuffer | None:
    if depth > 4:
        return None
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Name) and expr.func.value in classes:
            return classes[expr.func.value]
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODULE_CHAIN:
            return _instance_of(prov, expr.func.value, site, classes, depth + 1)
        copied = positional_args(expr)
        if len(copied) == 1 and prov.index.qualified_names(expr.func) & _COPIES:
            return _instance_of(prov, copied[0].value, site, classes, depth + 1)  # a copy
        return None
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site) or []
        made = [
            _instance_of(prov, b.value, s, classes, depth + 1)
            for b, s in found
            if b.kind == "assign" and b.value is not None
        ]
        if found and len(made) == len(found) and all(m is not None for m in made):
            return made[0]
    return None


def _registered(prov: Provenance, cls: cst.ClassDef) -> GateBuffer | None:
    """The first floating gate buffer ``cls``'s own methods register."""
    start = Site((prov.index.module, cls), None)
    stack: list[tuple[cst.CSTNode, Site, cst.For | None]] = [(cls.body, start, None)]
    while stack:
        node, site, loop = stack.pop()
        if isinstance(node, cst.ClassDef):
            continue
        if isinstance(node, cst.FunctionDef):  # its locals decide what the buffer is made of
            site = Site((*site.scopes, node), None)
        elif isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            site = Site(site.scopes, node)
        if isinstance(node, cst.For):
            loop = node
        if isinstance(node, cst.Call) and method_name(node) == "register_buffer":
            args = positional_args(node)
            key = _buffer_name(prov, args[0].value, site, loop) if args else None
            if (
                key is not None
                and prov.index.gate_caches.matches(key)
                and len(args) >= 2
                and _floating(prov, site, args[1].value)
            ):
                if isinstance(args[0].value, cst.FormattedString) and key == static_name(
                    args[0].value
                ):  # not told by a loop over names: named as written
                    key = prov.index.module.code_for_node(args[0].value)
                return GateBuffer(cls, key, node, made_by=_maker(prov, cls, key))
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            # `self.g_cache = nn.Buffer(torch.zeros(...))`
            buffer = node.value
            args = positional_args(buffer)
            for target in node.targets:
                name = binding_name(target.target)
                if (
                    name is not None
                    and isinstance(target.target, cst.Attribute)
                    and prov.index.gate_caches.matches(name)
                    and prov.index.qualified_names(buffer.func) & _BUFFER_CLASSES
                    and args
                    and _floating(prov, site, args[0].value)
                ):
                    return GateBuffer(cls, name, node, made_by=_maker(prov, cls, name))
        stack.extend((child, site, loop) for child in reversed(syntax_children(node)))
    return None


def _maker(prov: Provenance, cls: cst.ClassDef, name: str) -> str:
    """The method of ``cls`` that makes the buffer ``name`` (:mod:`.buffer_makers`)."""
    parsed = _as_ast(prov, cls)
    return buffer_makers(parsed).get(name, CONSTRUCTION) if parsed else CONSTRUCTION


def constructing(prov: Provenance, cls: cst.ClassDef) -> set[str]:
    """The methods of ``cls`` that construction runs (``__init__`` and what it calls)."""
    parsed = _as_ast(prov, cls)
    return constructing_methods(parsed) if parsed else {"__init__"}


def _as_ast(prov: Provenance, cls: cst.ClassDef) -> ast.ClassDef | None:
    try:
        tree = ast.parse(textwrap.dedent(prov.index.module.code_for_node(cls)))
    except (SyntaxError, ValueError):
        return None
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    return classes[0] if classes else None


def _buffer_name(
    prov: Provenance, written: cst.BaseExpression, site: Site, loop: cst.For | None
) -> str | None:
    """The name a buffer is registered under; for ``f"static_{name}"`` in a loop over names, the
    one of its iterations that names a gate cache (else the first)."""
    key = static_name(written)
    if (key is not None and prov.index.gate_caches.matches(key)) or loop is None:
        return key
    iterations = prov.iterations(loop.target, loop.iter, site)
    names = [prov.string_value(written, site, env) for env in iterations or ()]
    return next((n for n in names if n and prov.index.gate_caches.matches(n)), key)


def _floating(prov: Provenance, site: Site, value: cst.BaseExpression) -> bool:
    """Whether the buffer may be a float32 floating-point tensor: not an index or a mask, not
    None, and not allocated in another floating dtype (RL001-RL003 report that one where it is
    registered; a cast cannot narrow it further)."""
    if isinstance(value, cst.Name) and value.value == "None":
        return False
    facts = prov.tensor_facts(value, site)
    return not facts or any(
        f.kind is not Kind.NOT_FLOATING and definite_dtype(f) in {None, FLOAT32} for f in facts
    )


def keeps_float32(prov: Provenance, cls: cst.ClassDef) -> bool:
    """Whether ``cls`` decides that a cast keeps its gate buffers float32: guarded, or
    overriding a cast method of ``nn.Module`` with a body that restores float32."""
    return guarded_class(cls) or any(
        isinstance(statement, cst.FunctionDef)
        and statement.name.value in _CAST_OVERRIDES
        and _restores_float32(prov, statement)
        for statement in (cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ())
    )


def guarded_class(cls: cst.ClassDef) -> bool:
    """Whether ``cls`` is decorated with the guard or mixes it in."""
    decorated = any(
        GUARD
        in (
            dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
            or ""
        )
        for d in cls.decorators
    )
    mixin = any(_GUARD_MIXIN in (dotted_name(base.value) or "") for base in cls.bases)
    return decorated or mixin


def _restores_float32(prov: Provenance, function: cst.FunctionDef) -> bool:
    """Whether an override mentions float32 (``.float()``, ``torch.float32``), calls the guard,
    or sets a gate-cache attribute (``self.g_cache = g_cache``, the tensor kept from before)."""
    names = prov.index.gate_caches
    stack: list[cst.CSTNode] = [function.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            called = dotted_name(node.func) or ""
            if method_name(node) == "float" or called.rpartition(".")[2] == GUARD:
                return True
            if (
                isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _PUTTING_BACK
                and _module_table(node.func.value)
            ):
                return True  # `self._buffers.update(kept)`: puts back what it saved
            args = positional_args(node)
            # `setattr(self, "g_cache", kept)`, `self.register_buffer("g_cache", kept)`
            key = args[1] if called == "setattr" and len(args) > 1 else None
            if method_name(node) == "register_buffer" and args:
                key = args[0]
            name = static_name(key.value) if key is not None else None
            if name is not None and names.matches(name):
                return True
            if (
                called == "setattr"
                and key is not None
                and name is None
                and is_name(args[0].value, "self")
            ):
                return True  # `setattr(self, name, kept)` of each name saved before the cast
        elif isinstance(node, (cst.Attribute, cst.Name)):
            if literal_dtype(prov.index, node) == FLOAT32:
                return True
        elif isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Attribute):
            name = binding_name(node.target)
            if name is not None and names.matches(name):
                return True
        elif isinstance(node, cst.AssignTarget) and _module_table_entry(node.target):
            return True  # `self._buffers[name] = kept`: puts back what it saved before the cast
        stack.extend(syntax_children(node))
    return False


def _module_table_entry(target: cst.BaseExpression) -> bool:
    """``self._buffers[...]`` or ``self._parameters[...]``."""
    return isinstance(target, cst.Subscript) and _module_table(target.value)


def _module_table(expr: cst.BaseExpression) -> bool:
    """``self._buffers`` or ``self._parameters``."""
    return (
        isinstance(expr, cst.Attribute)
        and expr.attr.value in {"_buffers", "_parameters"}
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
    )


_PUTTING_BACK = frozenset({"update", "setdefault", "__setitem__"})


def _inherited(
    prov: Provenance,
    name: str,
    classes: dict[str, cst.ClassDef],
    own: dict[str, GateBuffer],
    seen: set[str],
) -> GateBuffer | None:
    if name in own:
        return own[name]
    if name in seen or name not in classes:
        return None
    seen.add(name)
    for base in classes[name].bases:
        base_name = dotted_name(base.value)
        if imported_base_keeps(prov, base.value):
            return None  # `class Model(ModelMixin)`: the project's base decides what casts do
        if base_name is not None and base_name in classes:
            if keeps_float32(prov, classes[base_name]):
                return None
            found = _inherited(prov, base_name, classes, own, seen)
            if found is not None:
                return found
    return None


def imported_base_keeps(prov: Provenance, base: cst.BaseExpression) -> bool:
    """Whether ``base`` is a class of another module of the project that (or one of whose
    bases) keeps gate buffers float32 through a cast (guarded, or a cast override that
    restores them)."""
    if prov.project is None or not isinstance(base, (cst.Name, cst.Attribute)):
        return False
    names = prov.index.imported_names(base)
    if len(names) != 1:
        return False
    found = prov.project.resolve(next(iter(names)))
    if not isinstance(found, Found) or found.definition[0] != "class":
        return False
    return class_keeps_float32(prov.project.index, found, prov.index.gate_caches.matches)
