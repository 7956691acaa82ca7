"""Methods of another module's classes called on an instance: a config object's
``ring_shapes()`` lists the rings a comprehension allocates, its ``ring_dtypes()`` names their
dtypes. Every kind of run sees them: a file that only calls the method (and names no gate cache)
is linted too."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, fix_in_project, lint_in_project, write_tree

from replaylint.lint.project.summaries import summarise

_ARGS = """
from dataclasses import dataclass

import torch


@dataclass
class ModelArgs:
    n_slots: int = 2
    head_dim: int = 4

    def ring_shapes(self, ring_len=4):
        return {
            "d_cache": (self.n_slots, ring_len, self.head_dim),
            "k_cache": (self.n_slots, ring_len, self.head_dim),
            "log_gate_cache": (self.n_slots, ring_len, self.head_dim),
        }

    def ring_names(self):
        return ("d_cache", "k_cache", "log_gate_cache")

    def gate_dtype(self, wire_dtype):
        return wire_dtype

    def scratch_shapes(self):
        return {"d_scratch": (self.n_slots,), "k_scratch": (self.n_slots,)}
"""

_MANAGER = """
import torch

from .args import ModelArgs


class Manager:
    def __init__(self, model_args: ModelArgs, dtype: torch.dtype):
        self.model_args = model_args
        self.dtype = dtype

    def example_state(self):
        return {name: torch.zeros(shape, dtype=self.dtype) for name, shape in self.model_args.ring_shapes().items()}

    def per_name(self):
        return {name: torch.empty(4, dtype=self.dtype) for name in self.model_args.ring_names()}

    def scratch(self):
        return {name: torch.empty(shape, dtype=self.dtype) for name, shape in self.model_args.scratch_shapes().items()}


def mixed(args: ModelArgs, dtype):
    shapes = args.ring_shapes()
    return {name: torch.zeros(shape, dtype=torch.float32 if name == "log_gate_cache" else dtype) for name, shape in shapes.items()}
"""

_FILES = {"pkg/__init__.py": "", "pkg/args.py": _ARGS, "pkg/manager.py": _MANAGER}


def test_a_method_summary_keeps_what_it_returns() -> None:
    summary = summarise(_ARGS)
    assert summary is not None
    members = summary["names"]["ModelArgs"][2]
    kind, _line, result, params = members["ring_names"]
    assert (kind, result[0], [p[0] for p in params]) == ("method", "tuple", ["self"])
    assert members["gate_dtype"][2] == ["param", "wire_dtype"]


def test_a_comprehension_over_a_project_method_allocates_the_gate_cache(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _FILES, "pkg/manager.py")
    assert [(f.code, f.location.row) for f in found] == [("RL006", 12), ("RL006", 15)]
    assert "log_gate_cache" in found[0].message


def test_the_fix_gives_the_gate_cache_float32(tmp_path: Path) -> None:
    fixed = fix_in_project(tmp_path, _FILES, "pkg/manager.py")
    assert 'dtype=torch.float32 if name == "log_gate_cache" else self.dtype' in fixed
    assert "scratch_shapes().items()}" in fixed
    assert fixed.count("torch.float32 if") == 3


_USER = """
import torch

from .args import ModelArgs


def state(model_args: ModelArgs, dtype):
    return {name: torch.zeros(s, dtype=dtype) for name, s in model_args.ring_shapes().items()}
"""


@pytest.mark.parametrize("args", [("--no-cache",), ("--no-cache", "pkg/user.py"), ()])
def test_a_file_that_only_calls_the_method_is_linted(tmp_path: Path, args: tuple[str, ...]) -> None:
    files = {"pyproject.toml": "[tool.replaylint]\n", "pkg/__init__.py": "", "pkg/args.py": _ARGS}
    write_tree(tmp_path, {**files, "pkg/user.py": _USER})
    assert cli_rows(tmp_path, *args) == [("pkg/user.py", 7, "RL006")]
    assert cli_rows(tmp_path, *args) == [("pkg/user.py", 7, "RL006")]  # from the cache too


def test_a_method_that_returns_no_gate_cache_name_lets_nothing_through(tmp_path: Path) -> None:
    files = {"pyproject.toml": "[tool.replaylint]\n", "pkg/__init__.py": "", "pkg/args.py": _ARGS}
    user = _USER.replace("ring_shapes()", "scratch_shapes()")
    write_tree(tmp_path, {**files, "pkg/user.py": user})
    assert cli_rows(tmp_path, "--no-cache") == []


def test_a_property_of_a_config_built_here_with_arguments_decides_the_dtype(
    tmp_path: Path,
) -> None:
    config = """
import torch


class PretrainedConfig:
    pass


class KimiConfig(PretrainedConfig):
    def __init__(self, torch_dtype="bfloat16"):
        self.torch_dtype = torch_dtype

    @property
    def gate_ring_dtype(self):
        return torch.float32

    @property
    def wire_dtype(self):
        return torch.bfloat16
"""
    user = """
import torch

from .config import KimiConfig


def build():
    config = KimiConfig(torch_dtype="float16")
    g_cache = torch.zeros(4, dtype=config.gate_ring_dtype)
    gate_cache = torch.zeros(4, dtype=config.wire_dtype)
    return g_cache, gate_cache
"""
    files = {"pkg/__init__.py": "", "pkg/config.py": config, "pkg/user.py": user}
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.code, f.location.row) for f in found] == [("RL001", 9)]


def test_a_property_decides_for_an_annotated_parameter_whatever_sets_attributes(
    tmp_path: Path,
) -> None:
    # an instance of a class with a base (whose `__init__` may set attributes), in a module
    # that sets attributes by name: neither can replace a property that has no setter
    config = """
import torch

from .compat import PretrainedConfig


class KimiConfig(PretrainedConfig):
    torch_dtype = "bfloat16"

    @property
    def gate_ring_dtype(self):
        return torch.float32

    @property
    def wire_dtype(self):
        return torch.bfloat16
"""
    user = """
import torch

from .config import KimiConfig


def build(config: KimiConfig, parent, name, module):
    setattr(parent, name, module)
    g_cache = torch.zeros(4, dtype=config.gate_ring_dtype)
    gate_cache = torch.zeros(4, dtype=config.wire_dtype)
    replayssm_g = torch.zeros(4, dtype=config.torch_dtype)
    return g_cache, gate_cache, replayssm_g
"""
    files = {
        "pkg/__init__.py": "",
        "pkg/compat.py": "class PretrainedConfig:\n    pass\n",
        "pkg/config.py": config,
        "pkg/user.py": user,
    }
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    # the class constant may be replaced on the instance: not provably anything
    assert [(f.code, f.location.row) for f in found] == [("RL001", 9), ("RL002", 10)]


_PARAMS = """
from dataclasses import dataclass


@dataclass(frozen=True)
class StateParams:
    heads: int
    ring: int

    @property
    def ring_shapes(self) -> dict:
        return {
            "d_cache": (self.heads, self.ring),
            "k_cache": (self.heads, self.ring),
            "g_cache": (self.heads, self.ring),
        }

    @property
    def conv_shapes(self) -> dict:
        return {"conv_state": (self.heads, 4)}
"""


@pytest.mark.parametrize(("shapes", "reported"), [("ring_shapes", True), ("conv_shapes", False)])
def test_the_keys_of_a_property_another_module_defines_are_the_cache_names(
    tmp_path: Path, shapes: str, reported: bool
) -> None:
    pool = (
        "import torch\n\nfrom .params import StateParams\n\n\n"
        "def allocate(params: StateParams, dtype):\n"
        f"    shapes = params.{shapes}\n"
        "    rings = {}\n"
        "    for name, shape in shapes.items():\n"
        "        rings[name] = torch.zeros(shape, dtype=dtype)\n"
        "    return rings\n"
    )
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        "pkg/__init__.py": "",
        "pkg/params.py": _PARAMS,
    }
    write_tree(tmp_path, {**files, "pkg/pool.py": pool})
    assert cli_rows(tmp_path, "--no-cache") == ([("pkg/pool.py", 10, "RL006")] if reported else [])
