"""Runs accuracy-corpus builders and prints what they return (used by lint_accuracy.py).

Reads a JSON list of ``module:function`` names (or bare module names, only imported) on stdin; the corpus half must be on
``sys.path``. Each builder runs with torch's default dtype reset to float32 and the seed set to
0 (a builder that takes ``tmp_dir`` gets an empty folder). What it returns is flattened to
``path -> tensor`` (dict keys, list indices, NamedTuple, dataclass and object fields, a module's
buffers and parameters), and each tensor is summarised by dtype, shape and a digest of its
bytes; tensors that share storage are listed as aliasing groups. Prints one JSON object:
``{name: {"tensors": {path: summary}, "aliases": [[path, ...]], "error": str | None}}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import sys
import tempfile
import traceback
from collections.abc import Iterator
from typing import Any

import torch

MAX_DEPTH = 8


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, torch.nn.Module):
        yield from value.named_buffers()
        yield from value.named_parameters()
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key), item
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        yield from zip(value._fields, value, strict=True)
    elif isinstance(value, (list, tuple)):
        yield from ((str(index), item) for index, item in enumerate(value))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield item.name, getattr(value, item.name)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for key, item in vars(value).items():
            if not key.startswith("_"):
                yield key, item


def flatten(value: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``value``, with a dotted path."""
    if isinstance(value, torch.Tensor):
        yield prefix or "<value>", value
        return
    if depth >= MAX_DEPTH or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return
    for key, item in _children(value):
        yield from flatten(item, f"{prefix}.{key}" if prefix else key, depth + 1)


def summarise(tensor: torch.Tensor) -> dict[str, Any]:
    data = tensor.detach().cpu().contiguous()
    raw = data.reshape(-1).view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
    return {
        "dtype": str(data.dtype),
        "shape": list(data.shape),
        "digest": hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16],
    }


def describe(value: Any) -> dict[str, Any]:
    tensors: dict[str, Any] = {}
    storages: dict[int, list[str]] = {}
    for path, tensor in flatten(value):
        if path in tensors:
            continue
        tensors[path] = summarise(tensor)
        if tensor.numel():
            storages.setdefault(tensor.untyped_storage().data_ptr(), []).append(path)
    aliases = sorted(sorted(paths) for paths in storages.values() if len(paths) > 1)
    return {"tensors": tensors, "aliases": aliases, "error": None}


def run(name: str) -> dict[str, Any]:
    """Runs ``module:function``; a bare ``module`` is only imported."""
    module_name, _, function_name = name.partition(":")
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    try:
        module = importlib.import_module(module_name)
        if not function_name:
            return {"tensors": {}, "aliases": [], "error": None}
        function = getattr(module, function_name)
        if "tmp_dir" in inspect.signature(function).parameters:
            with tempfile.TemporaryDirectory() as tmp_dir:
                return describe(function(tmp_dir=tmp_dir))
        return describe(function())
    except Exception as error:  # a builder that fails is an outcome, not a crash of the run
        last = traceback.extract_tb(error.__traceback__)[-1]
        where = "/".join(last.filename.split("/")[-2:]) + f":{last.lineno}"
        return {
            "tensors": {},
            "aliases": [],
            "error": f"{type(error).__name__}: {error} at {where}",
        }
    finally:
        torch.set_default_dtype(torch.float32)


def main() -> int:
    names: list[str] = json.load(sys.stdin)
    json.dump({name: run(name) for name in names}, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
