"""Objects whose class the analysis learns from the project: an attribute bound to a pool built
in another module (``self.pool = RingPool(...)``), and a loop over a function annotated to yield
``(name, cache)`` pairs. A loop that writes every entry of a mapping onto such an object by name
may replace the gate ring the class keeps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from project_support import cli_rows, fix_in_project, lint_in_project, write_tree

from replaylint.lint.project.return_annotations import returned_annotation
from replaylint.lint.project.self_attributes import self_attributes
from replaylint.lint.project.summaries import summarise

_POOL = """
import torch


class RingPool:
    def __init__(self, shapes, dtype):
        for name, shape in shapes.items():
            setattr(self, name, torch.zeros(shape, dtype=torch.float32 if name == "g_cache" else dtype))
        self.register_buffer("write_pos", torch.zeros(4, dtype=torch.int32))

    def layer(self, i):
        return self.d_cache[i], self.k_cache[i], self.g_cache[i]
"""

_ENGINE = """
import torch

from .kernels import kda_replayssm_decode
from .pool import RingPool


class Engine:
    def __init__(self, shapes, dtype):
        self.dtype = dtype
        self.pool = RingPool(shapes, dtype)

    def decode(self, q, i):
        d, k, g = self.pool.layer(i)
        return kda_replayssm_decode(q, d_cache=d, k_cache=k, g_cache=g)

    def wake_up(self, path):
        states = torch.load(path, weights_only=True)
        for name, tensor in states.items():
            setattr(self.pool, name, tensor.to("cuda"))
"""

_CACHES = """
from typing import Iterator, Tuple

import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, shape, dtype):
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))


def replay_caches(model: nn.Module) -> Iterator[Tuple[str, ReplayCache]]:
    for name, module in model.named_modules():
        if isinstance(module, ReplayCache):
            yield name, module


def first_cache(model: nn.Module) -> "ReplayCache":
    return next(c for _, c in replay_caches(model))
"""

_OFFLOAD = """
import torch

from .caches import replay_caches

KEEP_FP32 = ("g_cache",)


def host_dtype(buffer_name, dtype):
    return torch.float32 if buffer_name in KEEP_FP32 else dtype


def restore(model, snapshot):
    for name, cache in replay_caches(model):
        for buffer_name, tensor in snapshot[name].items():
            if tensor.is_floating_point():
                tensor = tensor.to(dtype=cache.d_cache.dtype)
            setattr(cache, buffer_name, tensor.to("cuda"))
"""


def _files(engine: str = _ENGINE, offload: str = _OFFLOAD) -> dict[str, str]:
    return {
        "pkg/__init__.py": "",
        "pkg/pool.py": _POOL,
        "pkg/engine.py": engine,
        "pkg/caches.py": _CACHES,
        "pkg/offload.py": offload,
    }


def test_a_class_summary_lists_the_attributes_its_methods_keep() -> None:
    cls = ast.parse(_POOL).body[1]
    assert isinstance(cls, ast.ClassDef)
    assert self_attributes(cls) == ["d_cache", "g_cache", "k_cache", "write_pos"]
    summary = summarise(_POOL)
    assert summary is not None
    assert summary["names"]["RingPool"][3]["attributes"] == self_attributes(cls)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("ReplayCache", ["instance", ["name", "ReplayCache"]]),
        ("'ReplayCache'", ["instance", ["name", "ReplayCache"]]),
        ("Optional[ReplayCache]", ["instance", ["name", "ReplayCache"]]),
        ("ReplayCache | None", ["instance", ["name", "ReplayCache"]]),
        ("list[ReplayCache]", ["elements", ["name", "ReplayCache"]]),
        ("tuple[ReplayCache, ...]", ["elements", ["name", "ReplayCache"]]),
        (
            "Iterator[Tuple[str, ReplayCache]]",
            ["pairs", [["name", "str"], ["name", "ReplayCache"]]],
        ),
        ("tuple[ReplayCache, int]", None),  # a record, not a collection
        ("dict[str, ReplayCache]", None),
    ],
)
def test_return_annotations_in_summaries(annotation: str, expected: object) -> None:
    node = ast.parse(annotation, mode="eval").body

    def value_of(expr: ast.expr) -> list[object]:
        return ["name", expr.id] if isinstance(expr, ast.Name) else ["unknown"]

    assert returned_annotation(node, value_of) == expected


def test_a_restore_onto_an_attribute_holding_a_pool_of_another_module(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _files(), "pkg/engine.py")
    assert [(f.code, f.location.row) for f in found] == [("RL005", 19)]
    assert "`self.pool.g_cache`" in found[0].message
    fixed = fix_in_project(tmp_path, _files(), "pkg/engine.py")
    assert (
        'tensor.to("cuda").to(torch.float32) if name == "g_cache" else tensor.to("cuda")' in fixed
    )


def test_a_restore_that_casts_the_gate_entry_is_clean(tmp_path: Path) -> None:
    engine = _ENGINE.replace(
        'tensor.to("cuda"))',
        'tensor.to("cuda", torch.float32) if name == "g_cache" else tensor.to("cuda"))',
    )
    assert lint_in_project(tmp_path, _files(engine=engine), "pkg/engine.py") == []


def test_a_pool_class_that_keeps_no_gate_ring_is_not_judged(tmp_path: Path) -> None:
    files = _files()
    files["pkg/pool.py"] = _POOL.replace("self.g_cache[i]", "None").replace('"g_cache"', '"scale"')
    assert lint_in_project(tmp_path, files, "pkg/engine.py") == []


def test_a_loop_over_annotated_pairs_knows_the_cache_class(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _files(), "pkg/offload.py")
    assert [(f.code, f.location.row) for f in found] == [("RL006", 16)]
    fixed = fix_in_project(tmp_path, _files(), "pkg/offload.py")
    assert (
        'tensor.to(dtype=torch.float32 if buffer_name == "g_cache" else cache.d_cache.dtype)'
        in fixed
    )


def test_a_loop_that_leaves_the_gate_ring_out_is_clean(tmp_path: Path) -> None:
    offload = _OFFLOAD.replace(
        "if tensor.is_floating_point():",
        'if tensor.is_floating_point() and buffer_name != "g_cache":',
    )
    assert lint_in_project(tmp_path, _files(offload=offload), "pkg/offload.py") == []


def test_an_unannotated_function_teaches_no_class(tmp_path: Path) -> None:
    files = _files()
    files["pkg/caches.py"] = _CACHES.replace(" -> Iterator[Tuple[str, ReplayCache]]", "")
    assert lint_in_project(tmp_path, files, "pkg/offload.py") == []


_MODULE_CACHES = """
from typing import Iterable, Tuple

from torch import nn


def iter_caches(model: nn.Module) -> Iterable[Tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if hasattr(module, "g_cache"):
            yield name, module
"""

_NARROW = """
import torch

from .module_caches import iter_caches


def narrow(model, dtype):
    for _, cache in iter_caches(model):
        for name, buf in list(cache.named_buffers(recurse=False)):
            cache._buffers[name] = buf.to(dtype)
    return model
"""


def test_a_loop_over_modules_annotated_as_any_module_casts_an_unknown_module(
    tmp_path: Path,
) -> None:
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        **_files(),
        "pkg/module_caches.py": _MODULE_CACHES,
        "pkg/narrow.py": _NARROW,
    }
    write_tree(tmp_path, files)
    narrow = [row for row in cli_rows(tmp_path, "--no-cache") if row[0] == "pkg/narrow.py"]
    assert narrow == [("pkg/narrow.py", 9, "RL004")]
    write_tree(
        tmp_path, {"pkg/module_caches.py": _MODULE_CACHES.replace("nn.Module]]", "object]]")}
    )
    narrow = [row for row in cli_rows(tmp_path, "--no-cache") if row[0] == "pkg/narrow.py"]
    assert narrow == []
