# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.
"""A small OmegaConf-like config object and ``instantiate``.

Recipes receive a :class:`DictConfig`: attribute access, ``${a.b}`` interpolation resolved
against the root when a value is read, and ``_component_`` nodes that :func:`instantiate`
turns into objects.
"""

import copy
import importlib
import re
from typing import Any, Dict, Iterator, Mapping, Optional

_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")


class DictConfig(Mapping):
    """Read-only nested mapping with attribute access and interpolation."""

    def __init__(self, content: Mapping[str, Any], root: Optional["DictConfig"] = None) -> None:
        object.__setattr__(self, "_content", dict(content))
        object.__setattr__(self, "_root", root)

    def _select(self, path: str) -> Any:
        node: Any = self._root if self._root is not None else self
        for part in path.strip().split("."):
            node = node[part]
        return node

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return DictConfig(value, root=self._root if self._root is not None else self)
        if isinstance(value, list):
            return [self._resolve(item) for item in value]
        if isinstance(value, str):
            whole = _INTERPOLATION.fullmatch(value)
            if whole is not None:
                return self._select(whole.group(1))
            return _INTERPOLATION.sub(lambda m: str(self._select(m.group(1))), value)
        return value

    def __getitem__(self, key: str) -> Any:
        return self._resolve(self._content[key])

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as error:
            raise AttributeError(f"config has no key {key!r}") from error

    def __setattr__(self, key: str, value: Any) -> None:
        raise TypeError("DictConfig is read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self._content)

    def __len__(self) -> int:
        return len(self._content)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._content else default


class OmegaConf:
    """The subset of the OmegaConf API the recipes use."""

    @staticmethod
    def create(content: Mapping[str, Any]) -> DictConfig:
        return DictConfig(copy.deepcopy(dict(content)))

    @staticmethod
    def to_container(cfg: DictConfig) -> Dict[str, Any]:
        """A plain (resolved) dict of ``cfg``."""
        return {
            key: OmegaConf.to_container(cfg[key]) if isinstance(cfg[key], DictConfig) else cfg[key]
            for key in cfg
        }


def instantiate(config: Optional[Mapping[str, Any]], *args: Any, **kwargs: Any) -> Any:
    """Builds the object a config node describes.

    The node's ``_component_`` is the dotted path of a callable; its other (resolved) keys and
    ``kwargs`` are passed as keyword arguments.

    Example:
        >>> cfg = OmegaConf.create({"model": {"_component_": "tt_kda.models.kimi_linear_tiny"}})
        >>> model = instantiate(cfg.model)
    """
    if config is None:
        return None
    if "_component_" not in config:
        raise ValueError(f"cannot instantiate a config without _component_: {dict(config)!r}")
    module_name, _, name = config["_component_"].rpartition(".")
    component = getattr(importlib.import_module(module_name), name)
    values = {key: config[key] for key in config if key != "_component_"}
    values = {
        key: OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
        for key, value in values.items()
    }
    return component(*args, **{**values, **kwargs})
