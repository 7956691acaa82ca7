"""A name that looks like a gate cache but is used as a mapping (a compiled-graph cache) is not
a tensor: none of its bindings is reported. Plural names stay collections of rings."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter


def _codes(source: str) -> list[str]:
    text = textwrap.dedent(source).lstrip("\n")
    return [f.code for f in Linter().check(text, "m.py")]


@pytest.mark.parametrize(
    "use",
    [
        "self.g_cache.get(bs)",
        "self.g_cache.clear()",
        "self.g_cache.setdefault(bs, None)",
        "self.g_cache.move_to_end(bs)",
        "list(self.g_cache.items())",
    ],
)
def test_a_mapping_named_like_a_gate_cache_is_not_reported(use: str) -> None:
    source = f"""
    import torch
    class GraphRunner:
        def __init__(self, dtype):
            self.g_cache = {{bs: torch.empty(bs, dtype=dtype) for bs in (1, 2)}}
        def replay(self, bs):
            return {use}
    """
    assert _codes(source) == []


@pytest.mark.parametrize(
    "use",
    [
        # a dict of rings by layer: a plural name keeps being checked
        "self.g_caches.get(bs)",
        # a gate cache read out of a dict by its name
        'self.g_cache.get("g_cache")',
        # a method of the result, not of the name
        "self.g_cache.float().clear()",
    ],
)
def test_other_uses_do_not_hide_a_gate_cache(use: str) -> None:
    source = f"""
    import torch
    class Pool:
        def __init__(self, dtype):
            self.g_cache = torch.empty(4, dtype=dtype)
            self.g_caches = {{bs: torch.empty(bs, dtype=dtype) for bs in (1, 2)}}
        def ring(self, bs):
            return {use}
    """
    assert "RL002" in _codes(source)


def test_a_mapping_is_the_class_of_its_uses() -> None:
    # the graph runner's `g_cache` is a dict; the pool's, in the same module, is a ring
    source = """
    import torch
    class GraphRunner:
        def __init__(self):
            self.g_cache = {}
        def replay(self, bs):
            return self.g_cache.get(bs)
    class StatePool:
        def __init__(self, shape):
            self.g_cache = torch.zeros(shape, dtype=torch.bfloat16)
    """
    assert _codes(source) == ["RL001"]
    # a use outside every class: the name is a mapping everywhere in the module
    outside = (
        textwrap.dedent(source) + "def lookup(runner, bs):\n    return runner.g_cache.get(bs)\n"
    )
    assert _codes(outside) == []


_GRAPHS = """
import torch
class GraphRunner:
    def __init__(self):
        self.g_cache = {}
    def replay(self, bs):
        return self.g_cache.get(bs)
"""


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        # a local of another function is that function's own ring
        (
            "def ring(shape):\n    g_cache = torch.zeros(shape, dtype=torch.half)\n    return g_cache\n",
            ["RL001"],
        ),
        # a key of a dict of rings outside every class
        (
            "def rings(shape):\n    return {'g_cache': torch.zeros(shape, dtype=torch.half)}\n",
            ["RL001"],
        ),
        # an attribute set outside every class may be the graph runner's
        ("def attach(runner):\n    runner.g_cache = {1: torch.zeros(1, dtype=torch.half)}\n", []),
        # a local the function itself reads as a mapping
        (
            "def graphs(dtype):\n    g_cache = {1: torch.zeros(1, dtype=dtype)}\n"
            "    return g_cache.get(1)\n",
            [],
        ),
    ],
)
def test_a_mapping_attribute_leaves_locals_and_dict_keys_elsewhere_rings(
    code: str, expected: list[str]
) -> None:
    assert _codes(_GRAPHS + "\n\n" + code) == expected
