"""The fix that numbers a comprehension whose elements are taken by position (RL006): float32
for the gate cache's position only, every other element as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from replaylint.lint.engine import Linter

_RINGS = """
import torch
from typing import NamedTuple


class Rings(NamedTuple):
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
"""


def _fixed(body: str) -> str:
    result = Linter().fix(_RINGS + body, unsafe=True)
    return result.source[len(_RINGS) :]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (  # a spread of a slice: numbered, the slice read once
            "def f(self, c):\n    return Rings(*(t.to(self.dtype) for t in c[:3]))\n",
            "def f(self, c):\n"
            "    return Rings(*(t.to(torch.float32 if position == 2 else self.dtype)"
            " for position, t in enumerate(c[:3])))\n",
        ),
        (  # the loop already uses `position`: another name is taken
            "def f(self, c):\n    return Rings(*(position.to(self.dtype) for position in c))\n",
            "def f(self, c):\n"
            "    return Rings(*(position.to(torch.float32 if ring_position == 2 else self.dtype)"
            " for ring_position, position in enumerate(c)))\n",
        ),
        (  # a tuple target keeps its parentheses inside the numbered one
            "def f(self, pairs):\n"
            "    d_cache, k_cache, g_cache = [a.to(self.dtype) for a, b in pairs]\n"
            "    return d_cache, k_cache, g_cache\n",
            "def f(self, pairs):\n"
            "    d_cache, k_cache, g_cache = [a.to(torch.float32 if position == 2 else self.dtype)"
            " for position, (a, b) in enumerate(pairs)]\n"
            "    return d_cache, k_cache, g_cache\n",
        ),
    ],
)
def test_the_gate_position_gets_float32(body: str, expected: str) -> None:
    fixed = _fixed(body)
    assert fixed == expected
    assert [f.code for f in Linter().check(_RINGS + fixed)] == []


def test_a_filtered_comprehension_gets_no_positional_fix() -> None:
    # a filter moves the positions: the gate cache's element is not the loop's third
    body = (
        "def f(self, c):\n"
        "    d_cache, k_cache, g_cache = (t.to(self.dtype) for t in c if t is not None)\n"
        "    return d_cache, k_cache, g_cache\n"
    )
    findings = Linter().check(_RINGS + body)
    assert [f.code for f in findings] == ["RL006"]
    assert findings[0].fix is None


def test_the_fixed_code_casts_only_the_gate_ring() -> None:
    torch = pytest.importorskip("torch")
    namespace: dict[str, object] = {}
    exec(
        compile(
            _fixed("def f(self, c):\n    return Rings(*(t.to(self.dtype) for t in c[:3]))\n"),
            "<fixed>",
            "exec",
        ),
        {**namespace, **_namespace()},
        namespace,
    )
    rings = [torch.zeros(2, dtype=torch.float32) for _ in range(4)]
    made = namespace["f"](SimpleNamespace(dtype=torch.bfloat16), rings)  # type: ignore[operator]
    assert [t.dtype for t in made] == [torch.bfloat16, torch.bfloat16, torch.float32]


def _namespace() -> dict[str, object]:
    scope: dict[str, object] = {}
    exec(compile(_RINGS, "<rings>", "exec"), scope)
    return scope
