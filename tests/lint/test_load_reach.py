"""Loads the analysis follows through payloads and project helpers: arrays of a pickled payload,
loops over an entry popped from one, and helpers of a module whose classes set attributes of
their own instances."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.engine import Linter
from replaylint.lint.project.summaries import summarise

_PAYLOAD = """
import pickle

import torch


def reload(path, make):
    with open(path, "rb") as f:
        payload = pickle.load(f)
    for entry in payload:
        for layer in entry.pop("replay_cache"):
            make(g_cache=torch.from_numpy(layer["g_cache"]))


def reload_cast(path, make):
    with open(path, "rb") as f:
        payload = pickle.load(f)
    for entry in payload:
        for layer in entry.pop("replay_cache"):
            make(g_cache=torch.from_numpy(layer["g_cache"]).float())
"""


def test_arrays_of_a_pickled_payload_keep_their_saved_dtype() -> None:
    findings = Linter().check(_PAYLOAD, "example.py")
    assert [(f.location.row, f.code) for f in findings] == [(12, "RL005")]
    assert 'g_cache=torch.from_numpy(layer["g_cache"]).to(torch.float32)' in (
        Linter().fix(_PAYLOAD, "example.py").source
    )


_UTILS = """
from collections import OrderedDict

import torch


def load_file(filename, device="cpu"):
    with open(filename, "rb") as reader:
        archive = torch.load(reader, map_location=device, weights_only=True)
    return dict(archive["tensors"])


class BaseOutput(OrderedDict):
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
"""


def test_an_instance_setattr_leaves_the_module_s_names_certain() -> None:
    summary = summarise(ast.parse(_UTILS))
    assert summary["writes_names"] is False
    assert summary["loaders"] == {"load_file": [["attr", ["name", "torch"], "load"]]}
    module_write = _UTILS + "\nimport sys\nsys.modules[__name__].__setattr__('x', 1)\n"
    assert summarise(ast.parse(module_write))["writes_names"] is True


def test_a_loader_of_such_a_module_is_read_as_a_load(tmp_path: Path) -> None:
    user = """import torch

from .utils import load_file


def restore(path, device, make):
    tensors = load_file(path)
    return make(g_cache=tensors["g_cache"].to(device=device))
"""
    files = {"pkg/__init__.py": "", "pkg/utils/__init__.py": _UTILS, "pkg/user.py": user}
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    assert rows == [(8, "RL005")]


_LIST_CACHE = """
import torch


class ReplayCache:
    def __init__(self, layers, shape):
        self.gate_cache = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]
"""

_RESTORE = """
import io

import torch

from .cache import ReplayCache


def restore(cache: ReplayCache, blob: bytes) -> ReplayCache:
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    cache.gate_cache = saved.pop("gate_cache")
    return cache


def restore_one(cache: ReplayCache, blob: bytes, layer: int) -> ReplayCache:
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    cache.gate_cache[layer] = saved.pop("gate_cache")[layer]
    return cache


def restore_each(cache: ReplayCache, blob: bytes) -> ReplayCache:
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    cache.gate_cache = [ring for ring in saved.pop("gate_cache")]
    return cache
"""


def test_a_loaded_list_of_rings_is_reported_without_a_cast_of_the_list(tmp_path: Path) -> None:
    # the class of another module keeps its gate caches in a list: `.to` of the loaded list
    # would raise, so the finding says to cast each ring; one ring of it is cast as a tensor
    files = {"pkg/__init__.py": "", "pkg/cache.py": _LIST_CACHE, "pkg/restore.py": _RESTORE}
    found = lint_in_project(tmp_path, files, "pkg/restore.py")
    assert [(f.location.row, f.code, f.fix is not None) for f in found] == [
        (10, "RL005", False),
        (16, "RL005", True),
        (22, "RL005", True),  # each ring the comprehension makes is cast
    ]
    assert "it holds several tensors, so cast each one" in found[0].message


_PASSED_ON = """
import torch


def load_reference(path):
    return torch.load(path, mmap=True, weights_only=True)


def install(cache, reference):
    cache.g_cache = reference["g_ring"].contiguous()


def generate(cache, *, reference=None, **sampling):
    if reference is not None:
        install(cache, reference)


def main(cache, path, options):
    generate(cache, reference=load_reference(path), **options)
"""


def test_a_checkpoint_passed_by_keyword_beside_a_spread_is_followed() -> None:
    # `**options` cannot pass `reference` again: the keyword is what the call passes
    findings = Linter().check(_PASSED_ON, "example.py")
    assert [(f.location.row, f.code) for f in findings] == [(10, "RL005")]


_CACHES_MODEL = """
import torch
from torch import nn


class RingCache(nn.Module):
    def __init__(self, shape, dtype):
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        kept = self.g_cache
        super()._apply(fn, recurse)
        self.g_cache = kept.to(self.d_cache.device)
        return self


class StaticRingCache(RingCache):
    pass


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Linear(4, 4)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(2))

    def setup_caches(self, shape, dtype, static=False):
        cache_cls = StaticRingCache if static else RingCache
        for b in self.layers:
            b.attention.cache = cache_cls(shape, dtype)
"""


@pytest.mark.parametrize(
    ("assign", "guarded", "reported"),
    [("True", False, True), ("False", False, False), ("True", True, False)],
)
def test_an_assigning_load_into_a_part_another_module_installs_is_reported(
    tmp_path: Path, assign: str, guarded: bool, reported: bool
) -> None:
    restore = (
        "import torch\n\nfrom .model import Model\n\n\n"
        "def restore(model: Model, path):\n"
        '    """Each layer\'s d_cache and g_cache, as saved."""\n'
        "    snapshot = torch.load(path, mmap=True)\n"
        "    for i, b in enumerate(model.layers):\n"
        f'        b.attention.cache.load_state_dict(snapshot[f"layers.{{i}}"], assign={assign})\n'
    )
    model = _CACHES_MODEL
    if guarded:  # the guard keeps a loaded gate entry float32 as well
        model = "import replaylint.guards\n" + model.replace(
            "class RingCache(nn.Module):",
            "@replaylint.guards.keep_fp32_gate_caches\nclass RingCache(nn.Module):",
        )
    files = {"pkg/__init__.py": "", "pkg/model.py": model, "pkg/restore.py": restore}
    found = [(f.code, f.message) for f in lint_in_project(tmp_path, files, "pkg/restore.py")]
    assert [code for code, _ in found] == (["RL005"] if reported else [])
    if reported:  # its cast override is no help: the loaded tensor replaces the buffer
        assert "gate cache `g_cache` (registered at" in found[0][1]
