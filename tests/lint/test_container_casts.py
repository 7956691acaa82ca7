"""Ring records cast by their own method: ``state.to(device, dtype=...)`` of a dataclass whose
``to`` casts every floating tensor it holds, the gate ring's field among them."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from project_support import lint_in_project

from replaylint.lint.project.field_casters import field_casters

_STATE = """
from dataclasses import dataclass, fields
from typing import List, Optional

import torch


@dataclass
class ReplayState:
    d_cache: List[torch.Tensor]
    k_cache: List[torch.Tensor]
    g_cache: List[torch.Tensor]

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "ReplayState":
        def move(tensor):
            if dtype is not None and tensor.is_floating_point():
                return tensor.to(device=device, dtype=dtype)
            return tensor.to(device=device)

        return ReplayState(*([move(t) for t in getattr(self, f.name)] for f in fields(self)))

    def with_dk_dtype(self, dtype: torch.dtype) -> "ReplayState":
        return ReplayState([t.to(dtype) for t in self.d_cache], [t.to(dtype) for t in self.k_cache], self.g_cache)
"""

_USE = """
import torch

from pkg.state import ReplayState


def adopt(state: ReplayState, dtype: torch.dtype):
    moved = state.to("cpu")
    kept = state.to(dtype=torch.float32)
    narrowed = state.with_dk_dtype(dtype)
    first_gate = state.g_cache[0]
    return moved, kept, narrowed, first_gate, state.to(device="cpu", dtype=dtype)


def adopt_half(d, k, g):
    state = ReplayState(d, k, g)
    return state.to(None, torch.bfloat16)
"""

_FILES = {"pkg/__init__.py": "", "pkg/state.py": _STATE, "pkg/use.py": _USE}


def test_a_method_that_casts_every_walked_tensor_is_listed_and_one_of_one_field_is_not() -> None:
    tree = ast.parse(textwrap.dedent(_STATE))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    assert field_casters(cls) == {"to": [1, "dtype", 17]}


def test_a_call_that_casts_the_record_to_a_narrow_dtype_is_reported(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _FILES, "pkg/use.py")
    assert [(f.location.row, f.code) for f in found] == [(11, "RL004"), (16, "RL004")]
    first, second = (f.message for f in found)
    assert "casts every floating tensor of `ReplayState`" in first
    assert "`dtype`, a parameter, which is not provably float32" in first
    assert "its gate ring `g_cache` included" in first
    assert "to torch.bfloat16" in second
