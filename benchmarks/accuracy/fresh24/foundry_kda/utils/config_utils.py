# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""A small omegaconf-like config object and the defaults of the model configs.

``DictConfig`` gives attribute access to nested mappings and resolves ``${a.b}``
interpolations against the root of the config, which is all the YAML configs of this project
use of omegaconf.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import torch

__all__ = [
    "COMPOSER_MODEL_DEFAULTS",
    "DictConfig",
    "dtype_from_str",
    "merge",
    "to_container",
]

_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")
_MISSING = object()


class DictConfig(MutableMapping[str, Any]):
    """Nested mapping with attribute access and ``${dotted.key}`` interpolation."""

    def __init__(self, content: Mapping[str, Any] | None = None, *, parent: DictConfig | None = None):
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_content", {})
        for key, value in (content or {}).items():
            self[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._resolve(self._content[key])

    def __setitem__(self, key: str, value: Any) -> None:
        self._content[key] = self._wrap(value)

    def __delitem__(self, key: str) -> None:
        del self._content[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._content)

    def __len__(self) -> int:
        return len(self._content)

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __repr__(self) -> str:
        return f"DictConfig({self._content!r})"

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, DictConfig):
            return DictConfig(value._content, parent=self)
        if isinstance(value, Mapping):
            return DictConfig(value, parent=self)
        if isinstance(value, list):
            return [self._wrap(item) for item in value]
        return value

    def _root(self) -> DictConfig:
        node = self
        while node._parent is not None:
            node = node._parent
        return node

    def _resolve(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        whole = _INTERPOLATION.fullmatch(value)
        if whole is not None:
            return self._root().select(whole.group(1))
        return _INTERPOLATION.sub(lambda m: str(self._root().select(m.group(1))), value)

    def select(self, dotted: str, default: Any = _MISSING) -> Any:
        """The value at ``dotted`` (``"a.b.c"``) from this node, interpolations resolved."""
        node: Any = self
        for part in dotted.split("."):
            if isinstance(node, DictConfig) and part in node._content:
                node = node[part]
            elif default is _MISSING:
                raise KeyError(f"missing config key {dotted!r}")
            else:
                return default
        return node


def to_container(cfg: Any, resolve: bool = True) -> Any:
    """``cfg`` as plain dicts and lists (interpolations resolved unless ``resolve=False``)."""
    if isinstance(cfg, DictConfig):
        items = cfg.items() if resolve else cfg._content.items()
        return {key: to_container(value, resolve) for key, value in items}
    if isinstance(cfg, list):
        return [to_container(item, resolve) for item in cfg]
    return cfg


def _merge_into(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, DictConfig):
            value = to_container(value, resolve=False)
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge_into(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def merge(*configs: Mapping[str, Any] | DictConfig) -> DictConfig:
    """Deep merge, later configs winning; interpolations are kept and resolved on access."""
    merged: dict[str, Any] = {}
    for cfg in configs:
        plain = to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
        _merge_into(merged, plain)
    return DictConfig(merged)


_STR_TO_DTYPE: dict[str, torch.dtype] = {
    **dict.fromkeys(("fp32", "float32", "float"), torch.float32),
    **dict.fromkeys(("bf16", "bfloat16", "amp_bf16"), torch.bfloat16),
    **dict.fromkeys(("fp16", "float16", "half", "amp_fp16"), torch.float16),
}


def dtype_from_str(name: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"float32"``, ``"amp_fp16"``, ... as a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return _STR_TO_DTYPE[str(name).lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}") from None


#: Defaults merged under every Composer model config. ``dtype`` is the precision the decode
#: caches are made for; ``decode_cache`` sizes the eval-time ReplaySSM caches.
COMPOSER_MODEL_DEFAULTS: dict[str, Any] = {
    "architecture": "kimi_linear",
    "dtype": "bf16",
    "decode_cache": {
        "enabled": False,
        "num_slots": 2,
        "ring_len": 4,
        "ring_dtype": "${dtype}",
        "gate_dtype": "${decode_cache.ring_dtype}",
        "state_dtype": "fp32",
        "preallocate_model_rings": False,
    },
}  # expect-bug: imported-policy id=cache-defaults
