"""``find_gate_caches`` and ``assert_fp32_gate_caches``: every gate cache in an object graph."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from replaylint.guards._errors import GateCacheDtypeError
from replaylint.guards._names import GateCacheNames, gate_cache_patterns, names_for

__all__ = ["FoundGateCache", "assert_fp32_gate_caches", "find_gate_caches", "module_gate_caches"]


@dataclass(frozen=True)
class FoundGateCache:
    """One gate cache found by :func:`find_gate_caches`: where it is and the tensor itself."""

    __module__ = "replaylint.guards"

    path: str
    """Attribute path from the root, e.g. ``model.layers.3.attn.g_cache`` or ``pool['g']``."""
    tensor: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        """The tensor's dtype."""
        return self.tensor.dtype

    def __str__(self) -> str:
        return f"{self.path}: {self.dtype}"


# Objects whose attributes hold no model state: never walked into.
_LEAF_TYPES = (
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    torch.dtype,
    torch.device,
)
_FOREIGN_PACKAGES = frozenset({"torch", "numpy", "logging", "threading", "asyncio", "re", "typing"})
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
_MAX_DEPTH = 64


def find_gate_caches(
    obj: object,
    /,
    *,
    root: str = "model",
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
) -> list[FoundGateCache]:
    """Every tensor in ``obj`` that sits under a gate-cache name, with its path, in walk order.

    Walks ``nn.Module`` parameters, buffers (persistent or not), plain tensor attributes and
    submodules; dataclasses; mappings (string keys are names); lists and tuples; and the
    attributes of plain objects such as cache pools. A tensor is a gate cache when the last name
    on its path matches the linter's gate-cache patterns (``g_cache``, ``*_gate_cache``, ...,
    plurals included); the elements of a container under such a name (``g_caches[3]``) are too.
    ``gate_cache_names`` replaces the default patterns and ``extend_gate_cache_names`` adds to
    them, as the linter's ``gate-cache-names`` and ``extend-gate-cache-names`` do. Every dtype is
    reported; :func:`assert_fp32_gate_caches` is the check.
    """
    names = names_for(
        gate_cache_patterns(gate_cache_names, extend_gate_cache_names, where="find_gate_caches")
    )
    return [FoundGateCache(path, tensor) for path, tensor in _walk(obj, root, names)]


def assert_fp32_gate_caches(
    obj: object,
    /,
    *,
    root: str = "model",
    gate_cache_names: Iterable[str] | None = None,
    extend_gate_cache_names: Iterable[str] = (),
    allow_none: bool = False,
) -> list[FoundGateCache]:
    """Raise :class:`GateCacheDtypeError` listing every gate cache in ``obj`` that is not float32.

    For tests and start-up checks. Returns what :func:`find_gate_caches` found (all float32).
    Finding no gate cache at all usually means the names differ from the patterns, so that raises
    ``LookupError`` unless ``allow_none=True``.
    """
    patterns = gate_cache_patterns(
        gate_cache_names, extend_gate_cache_names, where="assert_fp32_gate_caches"
    )
    found = [FoundGateCache(path, t) for path, t in _walk(obj, root, names_for(patterns))]
    if not found and not allow_none:
        raise LookupError(
            f"assert_fp32_gate_caches(): found no gate cache in {root} "
            f"({type(obj).__module__}.{type(obj).__qualname__}) under the names "
            f"{', '.join(patterns)}. Pass the names your code uses with "
            "extend_gate_cache_names=[...] (or gate_cache_names=[...] to replace these), or "
            "allow_none=True if it holds none."
        )
    wrong = [entry for entry in found if entry.dtype is not torch.float32]
    if wrong:
        listing = "\n".join(f"  {entry}" for entry in wrong)
        raise GateCacheDtypeError(
            f"{len(wrong)} of {len(found)} ReplaySSM gate caches in {root} are not "
            f"torch.float32:\n{listing}\nTheir per-step log-decays are summed and exponentiated, "
            "so rounding them becomes decay error that compounds across flushes. Fix: allocate "
            "them as torch.float32 (`replaylint --fix` rewrites the allocations), and protect "
            "modules from dtype casts with replaylint.guards.keep_fp32_gate_caches(model)."
        )
    return found


def module_gate_caches(
    module: torch.nn.Module, names: GateCacheNames
) -> Iterator[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """(owner, kind, name, tensor) for each parameter, buffer and plain tensor attribute of
    ``module`` and its submodules whose own name is a gate-cache name; kind is ``"parameter"``,
    ``"buffer"`` or ``"attribute"``."""
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None and names.matches(name):
                yield owner, "parameter", name, param
        for name, buffer in owner._buffers.items():
            if buffer is not None and names.matches(name):
                yield owner, "buffer", name, buffer
        for name, value in vars(owner).items():
            if (
                isinstance(value, torch.Tensor)
                and name not in _MODULE_INTERNALS
                and names.matches(name)
            ):
                yield owner, "attribute", name, value


def _walk(obj: object, root: str, names: GateCacheNames) -> Iterator[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    stack: list[tuple[object, str, bool, int]] = [(obj, root, names.matches(root), 0)]
    while stack:
        value, path, gate, depth = stack.pop()
        if isinstance(value, torch.Tensor):
            if gate:
                yield path, value
            continue
        if isinstance(value, _LEAF_TYPES) or id(value) in seen or depth >= _MAX_DEPTH:
            continue
        seen.add(id(value))
        children = list(_children(value, path, names, gate))
        # Pushed in reverse so that the walk reports in declaration order.
        stack.extend((child, p, g, depth + 1) for child, p, g in reversed(children))


def _children(
    value: object, path: str, names: GateCacheNames, gate: bool
) -> Iterator[tuple[object, str, bool]]:
    def named(name: str) -> bool:
        return gate or names.matches(name)

    if isinstance(value, torch.nn.Module):
        for name, param in value._parameters.items():
            yield param, f"{path}.{name}", named(name)
        for name, buffer in value._buffers.items():
            yield buffer, f"{path}.{name}", named(name)
        for name, attribute in vars(value).items():
            if name not in _MODULE_INTERNALS:
                yield attribute, f"{path}.{name}", named(name)
        for name, child in value._modules.items():
            yield child, f"{path}.{name}", named(name)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            yield getattr(value, field.name, None), f"{path}.{field.name}", named(field.name)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield item, f"{path}[{key!r}]", gate or (isinstance(key, str) and names.matches(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield item, f"{path}[{index}]", gate
    elif not callable(value) and type(value).__module__.split(".")[0] not in _FOREIGN_PACKAGES:
        for name, attribute in _attributes(value):
            yield attribute, f"{path}.{name}", named(name)


def _attributes(value: object) -> Iterator[tuple[str, object]]:
    """The instance attributes of a plain object, from ``__dict__`` and ``__slots__``."""
    yield from getattr(value, "__dict__", {}).items()
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                yield slot, getattr(value, slot)
