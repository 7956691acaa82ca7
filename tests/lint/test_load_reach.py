"""Loads the analysis follows through payloads and project helpers: arrays of a pickled payload,
loops over an entry popped from one, and helpers of a module whose classes set attributes of
their own instances."""

from __future__ import annotations

import ast
from pathlib import Path

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
