"""``keep_fp32_gate_caches``: gate caches stay float32 through module casts and state-dict loads.

``nn.Module.to``, ``.half()``, ``.bfloat16()``, ``.double()``, ``.type(...)``, ``.cuda()`` and
friends all go through ``Module._apply(fn)``, which calls ``fn`` on every parameter, buffer (and
gradient) of the module and its submodules. A protected module overrides ``_apply``: it runs
``fn`` as usual and, for a gate-cache tensor whose result is not float32, keeps the result's
device and strides but builds it as float32 from the original tensor (no round trip through the
narrower dtype). ``load_state_dict`` keeps them float32 too: with ``assign=True`` (where the
loaded tensor replaces the module's) it converts them back, and it refuses float64 values that
float32 cannot hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar, overload

import torch

from replaylint.guards._cast import narrowing_refusal, narrows
from replaylint.guards._errors import GateCacheDtypeError
from replaylint.guards._names import GateCacheNames, gate_cache_patterns, names_for
from replaylint.guards._walk import module_gate_caches

__all__ = ["KeepFp32GateCaches", "keep_fp32_gate_caches"]

M = TypeVar("M", bound=torch.nn.Module)
C = TypeVar("C", bound=type[torch.nn.Module])

_F32 = torch.float32
_PATTERNS_ATTR = "_replaylint_gate_cache_patterns"


class KeepFp32GateCaches(torch.nn.Module):
    """Mixin: this module's gate caches stay float32 through dtype casts and state-dict loads.

    Put it first among the bases (``class Layer(KeepFp32GateCaches, nn.Module)``). Every
    parameter, buffer and plain tensor attribute of the module and its submodules whose name is a
    gate-cache name (the linter's patterns; set ``replaylint_gate_cache_names`` to replace them or
    ``replaylint_extend_gate_cache_names`` to add to them on the class) keeps dtype float32 when
    the module is cast (``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.double()``,
    ``.type(...)``), while device moves and memory formats apply as usual. ``load_state_dict``
    keeps them float32 as well. :func:`keep_fp32_gate_caches` gives an existing instance or class
    the same protection.
    """

    __module__ = "replaylint.guards"

    replaylint_gate_cache_names: ClassVar[tuple[str, ...] | None] = None
    replaylint_extend_gate_cache_names: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        kept: set[int] = set()
        for _owner, _kind, _name, tensor in module_gate_caches(self, _names_of(self)):
            kept.add(id(tensor))
            if tensor.grad is not None:
                kept.add(id(tensor.grad))
        if not kept:
            return super()._apply(fn, recurse)  # type: ignore[no-untyped-call]

        def keep_float32(t: torch.Tensor) -> torch.Tensor:
            result = fn(t)
            if (
                id(t) in kept
                and isinstance(result, torch.Tensor)
                and result.dtype is not _F32
                and t.is_floating_point()
            ):
                return _float32_as(result, t, where=f"{type(self).__name__}.to()")
            return result

        return super()._apply(keep_float32, recurse)  # type: ignore[no-untyped-call]

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        names = _names_of(self)
        for key, value in state_dict.items():
            if (
                isinstance(value, torch.Tensor)
                and names.matches(key.rsplit(".", 1)[-1])
                and value.is_floating_point()
                and narrows(value.dtype, _F32)
            ):
                reason = narrowing_refusal(value, value.to(_F32))
                if reason is not None:
                    raise GateCacheDtypeError(
                        f"load_state_dict(): the gate cache {key!r} is {value.dtype} and cannot be "
                        f"loaded into torch.float32: {reason}. Fix: check the checkpoint; the gate "
                        "cache holds per-step log-decays, which fit float32."
                    )
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        _make_float32(self, names, where="load_state_dict()")
        return result


@overload
def keep_fp32_gate_caches(
    target: C,
    /,
    *,
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
) -> C: ...
@overload
def keep_fp32_gate_caches(
    target: M,
    /,
    *,
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
) -> M: ...
@overload
def keep_fp32_gate_caches(
    target: None = None,
    /,
    *,
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
) -> Callable[[C], C]: ...
def keep_fp32_gate_caches(
    target: Any = None,
    /,
    *,
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
) -> Any:
    """Keep every gate cache of a module float32 through dtype casts and state-dict loads.

    On an instance (``keep_fp32_gate_caches(model)``): converts any floating gate cache that is
    not float32 now, as ``.to(torch.float32)`` would, then protects the module and each submodule
    that holds a gate cache; returns the module. On a class (``@keep_fp32_gate_caches`` or
    ``@keep_fp32_gate_caches(extend_gate_cache_names=[...])``): returns a subclass of the same name
    with :class:`KeepFp32GateCaches` mixed in.

    Gate caches are found by name, as the linter finds them; ``gate_cache_names`` replaces the
    default patterns and ``extend_gate_cache_names`` adds to them. A gate cache whose dtype is
    not floating point raises :class:`GateCacheDtypeError`, as does a float64 one whose values
    float32 cannot hold.
    """
    patterns = gate_cache_patterns(
        gate_cache_names, extend_gate_cache_names, where="keep_fp32_gate_caches"
    )
    if target is None:
        return lambda cls: _protect_class(cls, patterns)
    if isinstance(target, type):
        return _protect_class(target, patterns)
    if isinstance(target, torch.nn.Module):
        return _protect_instance(target, patterns)
    raise TypeError(
        "keep_fp32_gate_caches() takes an nn.Module instance or subclass; got "
        f"{type(target).__module__}.{type(target).__qualname__}. To check other objects (cache "
        "pools, dicts, dataclasses), use assert_fp32_gate_caches(obj)."
    )


def _protect_class(cls: type[Any], patterns: tuple[str, ...]) -> type[Any]:
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TypeError(f"@keep_fp32_gate_caches decorates nn.Module subclasses; got {cls!r}.")
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "replaylint_gate_cache_names": patterns,
        "replaylint_extend_gate_cache_names": (),
    }
    return type(cls.__name__, (KeepFp32GateCaches, cls), namespace)


def _protect_instance(module: M, patterns: tuple[str, ...]) -> M:
    names = names_for(patterns)
    _make_float32(module, names, where="keep_fp32_gate_caches()")
    owners = [module] + [owner for owner, *_ in module_gate_caches(module, names)]
    for owner in dict.fromkeys(owners):  # each module once, in order
        owner.__dict__[_PATTERNS_ATTR] = patterns
        if not isinstance(owner, KeepFp32GateCaches):
            owner.__class__ = _protected_class_of(type(owner))
    return module


_PROTECTED_CLASSES: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}


def _protected_class_of(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """A subclass of ``cls`` with the mixin, made once per class, that pickles as ``cls`` does."""
    protected = _PROTECTED_CLASSES.get(cls)
    if protected is None:
        namespace = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "__reduce_ex__": _reduce_protected,
            "_replaylint_base_class": cls,
        }
        protected = type(cls.__name__, (KeepFp32GateCaches, cls), namespace)
        _PROTECTED_CLASSES[cls] = protected
    return protected


def _reduce_protected(self: torch.nn.Module, protocol: Any) -> tuple[Any, ...]:
    # The protected class is made at run time and cannot be found by name: pickle the instance
    # as one of its base class, and protect it again when it is loaded.
    base = type(self)._replaylint_base_class  # type: ignore[attr-defined]
    return (_rebuild_protected, (base,), dict(self.__dict__))


def _rebuild_protected(base: type[torch.nn.Module]) -> torch.nn.Module:
    module = base.__new__(base)
    module.__class__ = _protected_class_of(base)
    return module


def _names_of(module: torch.nn.Module) -> GateCacheNames:
    patterns = module.__dict__.get(_PATTERNS_ATTR)
    if patterns is None:
        cls = type(module)
        declared = getattr(cls, "replaylint_gate_cache_names", None)
        extra = getattr(cls, "replaylint_extend_gate_cache_names", ())
        patterns = gate_cache_patterns(declared, extra, where=f"{cls.__qualname__}")
    return names_for(patterns)


def _make_float32(module: torch.nn.Module, names: GateCacheNames, *, where: str) -> None:
    """Convert every floating gate cache of ``module`` that is not float32, as .to() would."""
    wrong: dict[int, str] = {}
    for owner, kind, name, tensor in module_gate_caches(module, names):
        if not tensor.is_floating_point():
            raise GateCacheDtypeError(
                f"{where}: the gate cache {name!r} ({kind} of {type(owner).__qualname__}) is "
                f"{tensor.dtype}; a gate cache holds floating-point log-decays and must be "
                f"torch.float32. Fix: allocate {name} as torch.float32."
            )
        if tensor.dtype is _F32:
            continue
        if kind == "attribute":
            owner.__dict__[name] = _float32_as(tensor, tensor, where=where)
        else:
            wrong[id(tensor)] = name
    if wrong:

        def convert(t: torch.Tensor) -> torch.Tensor:
            return _float32_as(t, t, where=where) if id(t) in wrong else t

        torch.nn.Module._apply(module, convert)  # type: ignore[no-untyped-call]


def _float32_as(layout: torch.Tensor, source: torch.Tensor, *, where: str) -> torch.Tensor:
    """``source``'s values as float32, with ``layout``'s device, shape and strides."""
    if narrows(source.dtype, _F32):
        reason = narrowing_refusal(source, source.to(_F32))
        if reason is not None:
            raise GateCacheDtypeError(
                f"{where}: a gate cache is {source.dtype} and cannot be kept as torch.float32: "
                f"{reason}. Fix: allocate it as torch.float32."
            )
    out = torch.empty_strided(layout.size(), layout.stride(), dtype=_F32, device=layout.device)
    with torch.no_grad():
        out.copy_(source)
    return out
