"""Project functions that only rearrange a tensor (a project's own ``rearrange``, ``split_heads``):
their result has the dtype of the parameter they rearrange, so a gate computed from one in the
activations' dtype is still seen as one."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.project.layout_functions import kept_parameter


def _kept(source: str) -> str | None:
    function = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(function, ast.FunctionDef)
    return kept_parameter(function)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(t):\n    return t.transpose(1, 2).contiguous()\n", "t"),
        (
            "def rearrange(t, pattern, **sizes):\n"
            "    t = t.reshape(*(sizes[n] for n in pattern))\n"
            "    t = t.permute(0, 2, 1)\n"
            "    return t.reshape(-1)\n",
            "t",
        ),
        ("def pad(t, n):\n    return F.pad(t, (0, n))[..., :n]\n", "t"),
        ("def heads(n, x):\n    y = x.unflatten(-1, (n, -1))\n    return y.T\n", "x"),
        # two parameters returned: no one dtype
        ("def f(a, b):\n    if a is None:\n        return b.flatten()\n    return a\n", None),
        # a reinterpretation or a cast is no layout
        ("def f(t, dtype):\n    return t.view(dtype)\n", None),
        ("def f(t):\n    return t.view(torch.bfloat16)\n", None),
        ("def f(t):\n    return t.float().reshape(-1)\n", None),
        # the tensor rebound to something else on the way
        ("def f(t, u):\n    t = t.reshape(-1)\n    t = u\n    return t\n", None),
        ("def f(t):\n    for t in range(3):\n        pass\n    return t\n", None),
        ("def f(t):\n    t += 1\n    return t\n", None),
        ("def f(t):\n    yield t.flatten()\n", None),
        ("def f(t):\n    return torch.cat([t, t])\n", None),
    ],
)
def test_kept_parameter(source: str, expected: str | None) -> None:
    assert _kept(source) == expected


_UTILS = """
import math


def rearrange(t, pattern, **axes_lengths):
    lhs, rhs = [side.split() for side in pattern.split("->")]
    t = t.reshape(*(axes_lengths.get(name, -1) for name in lhs))
    t = t.permute(*(lhs.index(name) for name in rhs))
    return t.contiguous()
"""

_GATE = """
import torch
import torch.nn.functional as F
from torch import nn

from .utils import rearrange


class Gate(nn.Module):
    def __init__(self, dim, heads, lower_bound=None):
        super().__init__()
        self.heads = heads
        self.to_gate = nn.Linear(dim, dim)
        self.A_log = nn.Parameter(torch.zeros(heads, 1))
        self.lower_bound = lower_bound
        self.register_buffer("g_cache", torch.zeros(4, heads, dim // heads, dtype=torch.float32))

    def log_decay(self, x):
        logits = rearrange(self.to_gate(x), "b h d -> b h d", h=self.heads)
        if self.lower_bound is not None:
            return self.lower_bound * logits.sigmoid()
        return -self.A_log.float().exp() * F.softplus(logits.float())
"""


def test_a_gate_computed_through_a_project_rearrange(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/utils.py": _UTILS, "pkg/gate.py": _GATE}
    found = lint_in_project(tmp_path, files, "pkg/gate.py")
    assert [(f.code, f.location.row) for f in found] == [("RL003", 20)]
    assert "`self.to_gate(x)`, a layer's output" in found[0].message


def test_a_project_function_that_casts_is_no_layout(tmp_path: Path) -> None:
    utils = _UTILS.replace("return t.contiguous()", "return t.contiguous().float()")
    files = {"pkg/__init__.py": "", "pkg/utils.py": utils, "pkg/gate.py": _GATE}
    assert lint_in_project(tmp_path, files, "pkg/gate.py") == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # read in full: what it returns is kept as it is (a dtype policy, a table's entry)
        ("def gate_dtype(dtype):\n    return dtype\n", ["param", "dtype"]),
        (
            "def pick(dtypes):\n    return dtypes['g']\n",
            ["item", ["param", "dtypes"], ["const", "g"]],
        ),
        # its tensor rebound on the way: a layout of that parameter
        (
            "def flat(t):\n    t = t.flatten()\n    t = t.contiguous()\n    return t\n",
            ["layout", "t"],
        ),
    ],
)
def test_a_summary_keeps_a_result_it_reads_in_full(source: str, expected: list[object]) -> None:
    from replaylint.lint.project.summaries import summarise

    summary = summarise(source)
    assert summary is not None
    name = next(iter(summary["names"]))
    assert summary["names"][name][3] == expected
