"""Records whose fields, the gate cache's among them, are filled from one ``*`` comprehension
(RL006), for record classes of the module and of another module of the project."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.engine import Linter

_RINGS = """
import torch
from typing import NamedTuple


class Rings(NamedTuple):
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor


class Layer(NamedTuple):
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    state: torch.Tensor
"""


def _codes(body: str) -> list[tuple[str, int]]:
    return [(f.code, f.location.row) for f in Linter().check(_RINGS + body)]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # three iterations fill the three fields, the gate cache's among them
        (
            "def f(s, dt):\n    return Rings(*(torch.zeros(s, dtype=dt) for _ in range(3)))\n",
            [("RL006", 18)],
        ),
        (
            "def f(s, dt):\n    return Rings(*[torch.zeros(x, dtype=dt) for x in (s, s, s)])\n",
            [("RL006", 18)],
        ),
        # a shared cast; the state after the spread is its own argument
        (
            "def f(self, c):\n    return Layer(*(t.to(self.dtype) for t in c[:3]), c.state)\n",
            [("RL006", 18)],
        ),
        # the comprehension bound to a local first; the state filled by keyword
        (
            "def f(s, dt, st):\n    parts = (torch.zeros(x, dtype=dt) for x in (s, s, s))\n"
            "    return Layer(*parts, state=st)\n",
            [("RL006", 18)],
        ),
        # the keyword fills the gate cache's field: the spread reaches only d and k
        (
            "def f(s, dt, st):\n    parts = (torch.zeros(x, dtype=dt) for x in (s, s))\n"
            "    return Layer(*parts, g_cache=torch.zeros(s), state=st)\n",
            [],
        ),
        # float32 for every field, or the gate cache's field not reached by the spread
        (
            "def f(s):\n    return Rings(*(torch.zeros(s, dtype=torch.float32) for _ in range(3)))\n",
            [],
        ),
        (
            "def f(s, dt):\n    g = torch.zeros(s, dtype=torch.float32)\n"
            "    return Rings(*(torch.zeros(s, dtype=dt) for _ in range(2)), g)\n",
            [],
        ),
        # elements passed on as they are: not made here
        ("def f(rings):\n    return Rings(*(r for r in rings))\n", []),
        # a per-iteration dtype that gives the gate cache float32
        (
            "def f(s, dt):\n    return Rings(*(torch.zeros(s, dtype=d) for d in (dt, dt, torch.float32)))\n",
            [],
        ),
    ],
)
def test_a_record_filled_from_one_comprehension(body: str, expected: list[tuple[str, int]]) -> None:
    assert _codes(body) == expected


def test_a_field_with_a_default_after_a_spread_of_unknown_length_is_not_guessed() -> None:
    source = """
import torch
from typing import NamedTuple


class Rings(NamedTuple):
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor = None


def f(parts, dt):
    return Rings(*(p.to(dt) for p in parts))
"""
    assert Linter().check(source) == []


def test_a_record_class_of_another_module(tmp_path: Path) -> None:
    user = (
        "import torch\nfrom .rings import Layer\n\n"
        "def f(self, c):\n    layer = Layer(*(t.to(self.dtype) for t in c[:3]), c.state)\n"
        "    return layer.g_cache\n"
    )
    files = {"pkg/__init__.py": "", "pkg/rings.py": _RINGS, "pkg/user.py": user}
    findings = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.code, f.location.row) for f in findings] == [("RL006", 5)]
    assert "`Layer.g_cache`" in findings[0].message
    assert "the same cast" in findings[0].message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("dtypes = {name: compute_dtype(device) for name in RINGS}", [("RL006", 4)]),
        (
            "dtypes = {n: torch.float32 if n == 'state' else self.dtype for n in RINGS}",
            [("RL006", 4)],
        ),
        ("dtypes = {n: torch.float32 if n == 'g_cache' else self.dtype for n in RINGS}", []),
        ("dtypes = {n: t.dtype for n, t in zip(RINGS, rings)}", []),
        ("dtypes = {n: self.dtype for n in RINGS[:2]}", []),
    ],
)
def test_a_dtype_table_built_by_a_comprehension(line: str, expected: list[tuple[str, int]]) -> None:
    source = f"RINGS = ('d_cache', 'k_cache', 'g_cache', 'state')\n\ndef f(self, device, rings):\n    {line}\n"
    assert [(f.code, f.location.row) for f in Linter().check(source)] == expected
