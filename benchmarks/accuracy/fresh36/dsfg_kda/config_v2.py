"""Configuration of the ragged inference engine, and the dtype helpers the configs use.

The classes follow the pydantic models of DeepSpeed inference v2: typed fields with defaults,
construction from keywords (nested configs also from dicts), dtype fields that accept any
spelling :class:`DtypeEnum` understands, and ``model_copy``.
"""

from __future__ import annotations

import contextlib
import copy
import typing
from enum import Enum
from typing import Any, Dict, Iterator, NamedTuple, Optional, Tuple, Union

import torch

_DTYPE_ALIASES = {
    **dict.fromkeys(("fp16", "float16", "half"), "fp16"),
    **dict.fromkeys(("bf16", "bfloat16", "bfloat"), "bf16"),
    **dict.fromkeys(("fp32", "float32", "float"), "fp32"),
    **{name: name for name in ("int8", "int32")},
}


class DtypeEnum(Enum):
    """Dtypes accepted by the configs; members can be looked up by ``torch.dtype`` or by name
    (``"bf16"``, ``"bfloat16"``, ``"torch.bfloat16"``)."""

    fp16 = torch.float16
    bf16 = torch.bfloat16
    fp32 = torch.float32
    int8 = torch.int8
    int32 = torch.int32

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            alias = _DTYPE_ALIASES.get(value.lower().removeprefix("torch."))
            if alias is not None:
                return cls[alias]
        return None


DtypeLike = Union[DtypeEnum, torch.dtype, str]


def to_torch_dtype(dtype: DtypeLike) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return DtypeEnum(dtype).value


def dtype_name(dtype: DtypeLike) -> str:
    """Short name of a dtype as written in snapshot headers (``"bf16"``)."""
    return DtypeEnum(to_torch_dtype(dtype)).name


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets torch's default floating dtype for a block (the way checkpoint loaders build modules)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


_REQUIRED = object()


class DeepSpeedConfigModel:
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: Dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            for name in vars(klass).get("__annotations__", {}):
                if not name.startswith("_"):
                    fields[name] = vars(klass).get(name, fields.get(name, _REQUIRED))
        cls.__ds_fields__ = fields
        cls.__ds_hints__ = None

    def __init__(self, **data: Any) -> None:
        unknown = sorted(set(data) - set(self.__ds_fields__))
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown field(s) {unknown}")
        for name, default in self.__ds_fields__.items():
            if name in data:
                value = data[name]
            elif default is _REQUIRED:
                raise ValueError(f"{type(self).__name__}: field {name!r} is required")
            else:
                value = copy.deepcopy(default)
            setattr(self, name, value)
        self._validate()

    @classmethod
    def _hint(cls, name: str) -> Any:
        if cls.__ds_hints__ is None:
            cls.__ds_hints__ = typing.get_type_hints(cls)
        hint = cls.__ds_hints__.get(name)
        if typing.get_origin(hint) is typing.Union:
            args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            hint = args[0] if len(args) == 1 else hint
        return hint

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__ds_fields__ and value is not None:
            hint = self._hint(name)
            if isinstance(hint, type) and issubclass(hint, Enum) and not isinstance(value, hint):
                value = hint(value)
            elif isinstance(hint, type) and issubclass(hint, DeepSpeedConfigModel) and isinstance(value, dict):
                value = hint(**value)
            elif typing.get_origin(hint) is tuple:
                value = tuple(value)
        object.__setattr__(self, name, value)

    def _validate(self) -> None:
        """Checks and derived fields; runs at the end of construction."""

    def model_copy(self, update: Optional[Dict[str, Any]] = None) -> "DeepSpeedConfigModel":
        data = {name: copy.deepcopy(getattr(self, name)) for name in self.__ds_fields__}
        data.update(update or {})
        return type(self)(**data)


class RingDtypes(NamedTuple):
    cache: torch.dtype
    """Delta and key rings."""
    decay: torch.dtype
    """Log-decay ring."""


def default_ring_dtypes(model_dtype: torch.dtype) -> RingDtypes:
    """Delta/key rings in the model's dtype; log-decays in float32."""
    return RingDtypes(cache=model_dtype, decay=torch.float32)


def lean_ring_dtypes(model_dtype: torch.dtype) -> RingDtypes:
    """fp16 delta/key rings whatever the model's dtype (more mantissa than bf16 for the same
    bytes); log-decays in float32."""
    return RingDtypes(cache=torch.float16, decay=torch.float32)


def uniform_ring_dtypes(model_dtype: torch.dtype) -> RingDtypes:
    """All rings in the model's dtype, so that a slot is one element type end to end."""
    return RingDtypes(cache=model_dtype, decay=model_dtype)  # expect-bug: imported-policy id=uniform-policy


RING_POLICIES = {
    "default": default_ring_dtypes,
    "lean": lean_ring_dtypes,
    "uniform": uniform_ring_dtypes,
}


class AllocationMode(Enum):
    PER_RING = "per_ring"
    """One allocation per ring and layer."""
    PACKED = "packed"
    """One allocation per layer holding its three rings."""


class SSMCacheConfig(DeepSpeedConfigModel):
    """Shape and element types of one layer's ReplaySSM cache (the analogue of ``KVCacheConfig``)."""

    num_slots: int
    state_shape: Tuple[int, int, int]
    """``(HV, V, K)`` of a slot's checkpoint state."""
    delta_shape: Tuple[int, int, int]
    """``(HV, L, V)``."""
    key_shape: Tuple[int, int, int]
    """``(H, L, K)``."""
    decay_shape: Tuple[int, int, int]
    """``(HV, L, K)``: per-step log-decays."""
    cache_dtype: DtypeEnum = DtypeEnum.fp16
    """Element type of the delta and key rings."""
    state_dtype: DtypeEnum = DtypeEnum.fp32
    decay_dtype: DtypeEnum = DtypeEnum.fp32
    allocation_mode: AllocationMode = AllocationMode.PER_RING

    @property
    def ring_len(self) -> int:
        return self.delta_shape[1]

    def _validate(self) -> None:
        if self.delta_shape[1] != self.key_shape[1] or self.delta_shape[1] != self.decay_shape[1]:
            raise ValueError(f"ring lengths differ: {self.delta_shape}, {self.key_shape}, {self.decay_shape}")


class MemoryConfig(DeepSpeedConfigModel):
    allocation_mode: AllocationMode = AllocationMode.PER_RING
    ring_policy: str = "default"
    """How ring dtypes follow the model: ``default``, ``lean`` or ``uniform`` (see ``RING_POLICIES``)."""

    def _validate(self) -> None:
        if self.ring_policy not in RING_POLICIES:
            raise ValueError(f"unknown ring policy {self.ring_policy!r}; expected one of {sorted(RING_POLICIES)}")


class DSStateManagerConfig(DeepSpeedConfigModel):
    max_tracked_sequences: int = 4
    """Sequences with a cache slot at once (the number of SSM slots per layer)."""
    max_ragged_batch_size: int = 64
    """Tokens in one ragged forward."""
    max_ragged_sequence_count: int = 4
    max_context: int = 512
    memory_config: MemoryConfig = MemoryConfig()
    cache_dtype: Optional[DtypeEnum] = None
    """Delta/key ring dtype; ``None``: the model's dtype."""
    decay_dtype: DtypeEnum = DtypeEnum.fp32
    swap_slots: int = 0
    """Host entries for sequences swapped out under slot pressure (0: no swapping)."""
    offload_dtype: Optional[DtypeEnum] = None
    """Element type of the swapped-out rings; ``None``: the ring dtype."""

    def _validate(self) -> None:
        if self.max_ragged_sequence_count > self.max_tracked_sequences:
            raise ValueError("max_ragged_sequence_count cannot exceed max_tracked_sequences")


class RaggedInferenceEngineConfig(DeepSpeedConfigModel):
    tensor_parallel: int = 1
    state_manager: DSStateManagerConfig = DSStateManagerConfig()
    compact_slots: int = 0
    """Keep this many slots of rings inside the model (single-replica deployments) instead of a
    ``BlockedSSMCache``; 0: use the state manager's cache."""
    pin_compact_rings: bool = False
    """Keep the in-model checkpoint and log-decay buffers in float32 when the model is cast."""
