# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Registries of builders.

Every pluggable piece (Composer models, architectures, callbacks, decode-cache pools) is looked
up by name, so that a YAML config can say ``name: kimi_linear`` and other packages can add
entries with ``registry.models.register("my_model")``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = [
    "Registry",
    "architectures",
    "cache_pools",
    "callbacks",
    "construct_from_registry",
    "models",
]


class Registry(Generic[T]):
    """A named collection of builder functions or classes."""

    def __init__(self, namespace: tuple[str, ...], description: str = "") -> None:
        self.namespace = namespace
        self.description = description
        self._entries: dict[str, T] = {}

    def register(self, name: str, func: T | None = None) -> Any:
        """Registers ``func`` under ``name``; without ``func``, returns a decorator."""

        def decorator(obj: T) -> T:
            existing = self._entries.get(name)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self}: {name!r} is already registered to {existing!r}")
            self._entries[name] = obj
            return obj

        return decorator(func) if func is not None else decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "nothing"
            raise KeyError(f"{self}: no entry named {name!r} (registered: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({'.'.join(self.namespace)})"


def construct_from_registry(
    name: str,
    registry: Registry[Any],
    post_validation_function: Callable[[Any], None] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Calls the entry ``name`` of ``registry`` with ``kwargs`` and validates the result."""
    constructed = registry.get(name)(**dict(kwargs or {}))
    if post_validation_function is not None:
        post_validation_function(constructed)
    return constructed


models: Registry[Any] = Registry(("foundry_kda", "models"), "Composer models")
architectures: Registry[Any] = Registry(("foundry_kda", "architectures"), "torch.nn model builders")
callbacks: Registry[Any] = Registry(("foundry_kda", "callbacks"), "training-loop callbacks")
cache_pools: Registry[Any] = Registry(("foundry_kda", "cache_pools"), "ReplaySSM decode-cache pools")
