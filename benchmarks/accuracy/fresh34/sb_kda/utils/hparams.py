"""A reader of the HyperPyYAML subset the recipes and model cards use.

``key: scalar``, nested mappings, ``!new:dotted.Class`` with its keyword arguments indented
below, ``!name:dotted.object`` (with arguments: a ``functools.partial``) and ``!ref <key>``
(the same object, not a copy). Overrides replace top-level keys before anything is built.
"""

import functools
import importlib
from typing import Any, Dict, List, Optional, Tuple


def _import(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def _scalar(raw: str) -> Any:
    special = {"null": None, "~": None, "": None, "true": True, "false": False}
    if raw in special:
        return special[raw]
    if raw[0] in "'\"" and raw[-1] == raw[0]:
        return raw[1:-1]
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _parse(lines: List[Tuple[int, str]], i: int, indent: int):
    node: Dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        key, _, value = lines[i][1].partition(":")
        i += 1
        children = None
        if i < len(lines) and lines[i][0] > indent:
            children, i = _parse(lines, i, lines[i][0])
        node[key.strip()] = (value.strip(), children)
    return node, i


def load_hyperpyyaml(yaml_stream, overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Builds the objects of a HyperPyYAML document (a string or an open file)."""
    text = yaml_stream.read() if hasattr(yaml_stream, "read") else yaml_stream
    lines = [(len(raw) - len(raw.lstrip()), raw.strip()) for raw in text.splitlines()
             if raw.strip() and not raw.lstrip().startswith("#")]
    tree, _ = _parse(lines, 0, 0)
    done: Dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if isinstance(value, str):
            tree[key] = (value, None)
        else:
            tree.pop(key, None)
            done[key] = value

    def top(key: str) -> Any:
        if key not in done:
            done[key] = build(*tree[key])
        return done[key]

    def build(raw: str, children) -> Any:
        kwargs = {k: build(*v) for k, v in (children or {}).items()}
        if raw.startswith("!new:"):
            return _import(raw[len("!new:"):])(**kwargs)
        if raw.startswith("!name:"):
            obj = _import(raw[len("!name:"):])
            return functools.partial(obj, **kwargs) if kwargs else obj
        if raw.startswith("!ref"):
            return top(raw[len("!ref"):].strip().strip("<>"))
        return kwargs if children is not None else _scalar(raw)

    for key in list(tree):
        top(key)
    return done
