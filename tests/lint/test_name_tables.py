"""A module constant that lists cache names, a gate cache's among them, imported by a file that
loops over it: that file makes the gate cache without naming it, and every kind of run lints it
(a full run, a cached run, a run over that file alone). A ``setattr`` in that file hides the
constant only when the object it sets may be the constant's module."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, write_tree

_FIELDS = """
import torch

TENSOR_FIELDS = ("ssm_state", "d_ring", "k_ring", "g_cache")
"""

_BACKEND = """
import math

import torch

from .fields import TENSOR_FIELDS


def read(path, shapes, dtype):
    tensors = {}
    for field in TENSOR_FIELDS:
        shape = shapes[field]
        field_dtype = torch.float32 if field == "ssm_state" else dtype
        tensors[field] = torch.from_file(f"{path}.{field}", size=math.prod(shape), dtype=field_dtype)
    return tensors
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_tree(
        tmp_path,
        {
            "pyproject.toml": "[tool.replaylint]\n",
            "pkg/__init__.py": "",
            "pkg/fields.py": _FIELDS,
            "pkg/backend.py": _BACKEND,
        },
    )
    return tmp_path


@pytest.mark.parametrize("args", [("--no-cache",), ("--no-cache", "pkg/backend.py")])
def test_a_loop_over_an_imported_name_table_is_linted(project: Path, args: tuple[str, ...]) -> None:
    assert cli_rows(project, *args) == [("pkg/backend.py", 13, "RL006")]


def test_a_cached_run_sees_the_table_change(project: Path) -> None:
    assert cli_rows(project) == [("pkg/backend.py", 13, "RL006")]
    assert cli_rows(project) == [("pkg/backend.py", 13, "RL006")]  # answered from the cache
    fields = project / "pkg" / "fields.py"
    fields.write_text(fields.read_text("utf-8").replace('"g_cache"', '"scratch"'), "utf-8")
    assert cli_rows(project) == []
    fields.write_text(_FIELDS.lstrip("\n"), "utf-8")
    assert cli_rows(project) == [("pkg/backend.py", 13, "RL006")]


def test_a_table_without_a_gate_cache_name_lets_nothing_through(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pyproject.toml": "[tool.replaylint]\n",
            "pkg/__init__.py": "",
            "pkg/fields.py": _FIELDS.replace('"g_cache"', '"scratch"') + "g_cache = None\n",
            "pkg/backend.py": _BACKEND,
        },
    )
    assert cli_rows(tmp_path, "--no-cache") == []


@pytest.mark.parametrize(
    ("setter", "found"),
    [
        ("setattr(cache, name, ring)", True),  # an object's attribute: the constant still holds
        ("setattr(self.cache, name, ring)", True),
        ('setattr(fields, "TENSOR_FIELDS", ("d_ring",))', False),  # the module's constant rebound
    ],
)
def test_a_setattr_hides_an_imported_constant_only_where_it_may_set_the_module(
    tmp_path: Path, setter: str, found: bool
) -> None:
    loader = (
        "import torch\n\nfrom . import fields\nfrom .fields import TENSOR_FIELDS\n\n\n"
        "def swap_in(self, cache, path):\n    snapshot = torch.load(path)\n"
        f"    for name in TENSOR_FIELDS:\n        ring = snapshot[name]\n        {setter}\n"
    )
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        "pkg/__init__.py": "",
        "pkg/fields.py": _FIELDS,
    }
    write_tree(tmp_path, {**files, "pkg/loader.py": loader})
    rows = [row for row in cli_rows(tmp_path, "--no-cache") if row[0] == "pkg/loader.py"]
    assert rows == ([("pkg/loader.py", 10, "RL006")] if found else [])


_RECORD = """
from dataclasses import dataclass

import torch


@dataclass
class LayerCache:
    ssm_state: torch.Tensor
    d_cache: torch.Tensor
    g_cache: torch.Tensor


class Kernel:
    def run(
        self,
        g_cache: torch.Tensor,
    ) -> None:
        pass
"""

_SPREAD = """
from .records import LayerCache


def narrow(layers, dtype):
    return [
        LayerCache(**{name: t if name == "ssm_state" else t.to(dtype) for name, t in layer.tensors().items()})
        for layer in layers
    ]
"""


def test_a_record_with_a_gate_field_is_a_table_and_a_parameter_is_not() -> None:
    from replaylint.lint.gatecache.names import GateCacheNames
    from replaylint.lint.run.name_tables import tables_in

    names = GateCacheNames(("g_cache",))
    assert "LayerCache" in tables_in(_RECORD.encode(), names)
    assert "Kernel" not in tables_in(_RECORD.encode(), names)


def test_a_file_that_fills_a_record_from_a_spread_comprehension_is_linted(tmp_path: Path) -> None:
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        "pkg/__init__.py": "",
        "pkg/records.py": _RECORD,
        "pkg/use.py": _SPREAD,
    }
    write_tree(tmp_path, files)
    assert cli_rows(tmp_path, "--no-cache") == [("pkg/use.py", 6, "RL006")]
