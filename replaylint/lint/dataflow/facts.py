"""What the analysis says about an expression's dtype: facts, and what would make it float32.

A :class:`TensorFact` is one way a tensor may have been made (a conditional gives two), with the
dtypes it may have (:class:`DtypeFact`) and, where one exists, a :data:`Float32Target`: *which*
node to change and *how* in terms of meaning (set this dtype, cast this value, add a dtype). How
that change is spelled in source is the fix layer's business (:mod:`replaylint.lint.fixes`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Literal

import libcst as cst

from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.torch_api import FLOAT32, NON_FLOATING_DTYPES


@dataclass(frozen=True)
class DtypeFact:
    """One dtype an expression may denote: a literal one, or ``dtype=None`` when not known."""

    dtype: str | None
    node: cst.BaseExpression
    """The expression the dtype was read from (the literal, or the unknown expression)."""
    binding: Binding | None = None
    """The local binding the dtype came through, if any (``ring_dtype = ...``)."""
    parameter: str | None = None
    """Set when the dtype is a parameter of the function being analysed."""
    origin: str = ""
    """Where another module of the project wrote the dtype (``from `WIRE_DTYPE` (pkg/policy.py:4)``),
    when it came through an import."""
    passed_by: cst.Call | None = None
    """The call of the module that passes this dtype for the parameter ``parameter`` (the
    allocation takes a dtype parameter, and this is what one caller gives it)."""

    @property
    def is_float32(self) -> bool:
        return self.dtype == FLOAT32


AllocationKind = Literal["factory", "like", "new"]


@dataclass(frozen=True)
class Allocation:
    """A call that allocates a tensor, and the argument that sets its dtype (if any)."""

    call: cst.Call
    kind: AllocationKind
    function: str
    dtype_arg: cst.Arg | None


class Kind(enum.Enum):
    FLOAT32 = "float32"
    EXPLICIT = "explicit"
    """Allocated with a dtype that is (or may be) a literal other than float32."""
    VARIABLE = "variable"
    """Allocated with a dtype expression that is not provably float32."""
    INHERITED = "inherited"
    """Allocated without a dtype: torch's default dtype, or another tensor's dtype."""
    CAST = "cast"
    """Cast to a dtype that is not provably float32."""
    LOADED = "loaded"
    """Loaded from a checkpoint or file without a cast."""
    PASSED = "passed"
    """Computed from a parameter to which every call of the function in the module passes a
    tensor of one dtype that is not float32."""
    NOT_FLOATING = "not-floating"
    """An integer, bool or complex tensor: an index or a mask, not a log-decay ring."""
    ACTIVATION = "activation"
    """Computed from the model's activations (an argument, a layer's output) by elementwise
    steps with numbers only: the model's dtype, unless something casts it."""
    UNKNOWN = "unknown"


# ----------------------------------------------------------------- what would make it float32
@dataclass(frozen=True)
class SetDtype:
    """``node`` is a dtype expression: make it float32 (``dtype=x`` -> ``dtype=torch.float32``).
    ``copying``: the ``.to(...)`` call it is the dtype of, which passes no ``copy``. Its result
    was a new tensor whenever the dtype changed; cast to float32, a float32 source would be
    handed back as it is, so the fixed call passes ``copy=True`` to stay a copy."""

    node: cst.BaseExpression
    copying: cst.Call | None = None


@dataclass(frozen=True)
class CastMethodToFloat:
    """``node`` names a cast method (``.half``): cast to float32 instead. ``call``: the call
    (``t.half()``), which gives a new tensor whenever the dtype changes; ``.float()`` would hand
    a float32 source back as it is, so where torch can be spelled it becomes
    ``t.to(torch.float32, copy=True)``."""

    node: cst.Name
    call: cst.Call | None = None


@dataclass(frozen=True)
class FloatTensorType:
    """``node`` names a legacy tensor type (``torch.cuda.HalfTensor``, as a name or a string):
    name its float32 type ``float_type`` instead."""

    node: cst.BaseExpression
    float_type: str


@dataclass(frozen=True)
class DeviceOfOther:
    """``node`` is the argument of ``x.to(other)``: keep ``other``'s device, take float32."""

    node: cst.Arg


@dataclass(frozen=True)
class TypeAsDeviceOfOther:
    """``node`` is ``x.type_as(other)``: make it ``x.to(other.device, float32)`` (unsafe: the
    legacy tensor-type name ``type_as`` goes through carries no device index)."""

    node: cst.Call


@dataclass(frozen=True)
class OverrideKwargsDtype:
    """``node`` is a ``**kwargs`` mapping whose ``dtype`` entry is not float32: override it."""

    node: cst.BaseExpression


@dataclass(frozen=True)
class CastValue:
    """``node`` makes the tensor: cast its result to float32."""

    node: cst.CSTNode


@dataclass(frozen=True)
class AddDtypeArgument:
    """``node`` allocates without a dtype: pass float32."""

    node: cst.Call


Float32Target = (
    SetDtype
    | CastMethodToFloat
    | FloatTensorType
    | DeviceOfOther
    | TypeAsDeviceOfOther
    | OverrideKwargsDtype
    | CastValue
    | AddDtypeArgument
)


@dataclass(frozen=True)
class TensorFact:
    kind: Kind
    node: cst.CSTNode
    """What a finding about this fact points at."""
    dtypes: tuple[DtypeFact, ...] = ()
    allocation: Allocation | None = None
    call: cst.Call | None = None
    """The cast, clone or load call."""
    detail: str = ""
    target: Float32Target | None = None
    """What to change to make this fact float32, if there is one safe change."""
    via: tuple[Binding, ...] = ()
    """Local tensor bindings followed to reach the fact, nearest first."""
    uses: tuple[cst.Name, ...] = ()
    """The name read at each step of ``via`` (``ring`` in ``self.g_cache = ring``)."""

    @property
    def literal_dtypes(self) -> tuple[str, ...]:
        return tuple(sorted({d.dtype for d in self.dtypes if d.dtype is not None}))

    @property
    def non_float32_literals(self) -> tuple[str, ...]:
        return tuple(d for d in self.literal_dtypes if d != FLOAT32)

    def followed(self, binding: Binding, use: cst.Name) -> TensorFact:
        return replace(self, via=(binding, *self.via), uses=(use, *self.uses))


def definite_dtype(fact: TensorFact) -> str | None:
    """The one literal dtype ``fact`` gives its tensor, if it gives exactly one."""
    if fact.kind is Kind.FLOAT32:
        return FLOAT32
    if fact.kind in {Kind.EXPLICIT, Kind.CAST, Kind.NOT_FLOATING, Kind.PASSED}:
        literals = {d.dtype for d in fact.dtypes}
        if len(literals) == 1 and None not in literals:
            return next(iter(literals))
    return None


def all_not_floating(dtypes: tuple[DtypeFact, ...]) -> bool:
    """Whether every dtype of ``dtypes`` is known and none is floating point."""
    return bool(dtypes) and all(d.dtype in NON_FLOATING_DTYPES for d in dtypes)


def decided(
    dtypes: tuple[DtypeFact, ...],
    node: cst.CSTNode,
    target: Float32Target | None,
    allocation: Allocation | None = None,
) -> TensorFact:
    """The fact of an allocation whose dtype is one of ``dtypes``: float32, not floating, or
    explicit (a literal that is not float32 among them) or variable, with ``target`` as its fix."""
    if all(f.is_float32 for f in dtypes):
        return TensorFact(Kind.FLOAT32, node, allocation=allocation, dtypes=dtypes)
    if all_not_floating(dtypes):
        return TensorFact(Kind.NOT_FLOATING, node, allocation=allocation, dtypes=dtypes)
    explicit = any(f.dtype not in {None, FLOAT32} for f in dtypes)
    kind = Kind.EXPLICIT if explicit else Kind.VARIABLE
    return TensorFact(kind, node, allocation=allocation, dtypes=dtypes, target=target)
