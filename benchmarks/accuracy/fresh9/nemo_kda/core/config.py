"""Stand-in for ``omegaconf``: ``DictConfig`` with attribute access and ``${a.b}`` interpolation, and the
``OmegaConf`` helpers the collections use (create, select, to_container, save/load)."""

import copy
import json
import re
from pathlib import Path

_INTERPOLATION = re.compile(r"^\$\{([^}]+)\}$")

class DictConfig:
    def __init__(self, content: dict, parent: "DictConfig | None" = None) -> None:
        self._parent = parent
        self._content = {k: DictConfig(v, self) if isinstance(v, dict) else v for k, v in content.items()}

    def _resolve(self, value):
        match, root = _INTERPOLATION.match(value) if isinstance(value, str) else None, self
        while root._parent is not None:
            root = root._parent
        return OmegaConf.select(root, match.group(1)) if match else value

    def __getattr__(self, key: str):
        if key.startswith("_") or key not in self._content:
            raise AttributeError(f"Missing key {key}")
        return self._resolve(self._content[key])

    def __contains__(self, key: str) -> bool:
        return key in self._content

    def get(self, key: str, default=None):
        return self._resolve(self._content[key]) if key in self._content else default

class OmegaConf:
    @staticmethod
    def create(obj: dict | None = None) -> DictConfig:
        return DictConfig(copy.deepcopy(obj or {}))

    @staticmethod
    def select(cfg: DictConfig, key: str, default=None):
        for part in key.split("."):
            if not isinstance(cfg, DictConfig) or part not in cfg:
                return default
            cfg = getattr(cfg, part)
        return cfg

    @staticmethod
    def to_container(cfg: DictConfig, resolve: bool = False) -> dict:
        out = {}
        for key, value in cfg._content.items():
            value = cfg._resolve(value) if resolve else value
            out[key] = OmegaConf.to_container(value, resolve) if isinstance(value, DictConfig) else value
        return out

    @staticmethod
    def save(cfg: DictConfig, path) -> None:  # resolved, as JSON (a YAML subset)
        Path(path).write_text(json.dumps(OmegaConf.to_container(cfg, resolve=True), indent=2))

    @staticmethod
    def load(path) -> DictConfig:
        return OmegaConf.create(json.loads(Path(path).read_text()))
