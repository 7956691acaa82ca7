"""Rings restored from a loaded mapping by name: ``setattr`` over a snapshot's items (RL005) and
a loop over ring names that stores ``snapshot[name]`` or a per-layer list of such entries
(RL006)."""

from __future__ import annotations

import pytest

from replaylint.lint.engine import Linter

_CACHE = """\
import torch

class ReplayCache:
    def __init__(self, shape):
        self.d_cache = torch.zeros(shape, dtype=torch.bfloat16)
        self.g_cache = torch.zeros(shape, dtype=torch.float32)

"""


def _found(source: str) -> list[tuple[str, int]]:
    return [(f.code, f.location.row) for f in Linter().check(source)]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # the object's class holds the gate cache
        (
            "def restore(path, shape):\n"
            "    cache = ReplayCache(shape)\n"
            "    for name, t in torch.load(path).items():\n"
            "        setattr(cache, name, t)\n"
            "    return cache\n",
            [("RL005", 11)],
        ),
        # a parameter the function reads the gate cache of
        (
            "def restore(cache, path):\n"
            "    sd = torch.load(path)\n"
            "    for name, t in sd['rings'].items():\n"
            "        setattr(cache, name, t)\n"
            "    return cache.g_cache\n",
            [("RL005", 11)],
        ),
        # a parameter whose gate cache another function of the module reads; entries of a
        # loaded mapping bound to a local first
        (
            "def restore(cache, path):\n"
            "    state = torch.load(path)\n"
            "    for name, t in state.items():\n"
            "        setattr(cache, name, t)\n"
            "\n"
            "def step(cache, i, g):\n"
            "    cache.g_cache[i] = g\n",
            [("RL005", 11)],
        ),
        # an attribute of self whose gate cache another method reads, the entries moved to a
        # device on the way (a move keeps their dtype)
        (
            "class Engine:\n"
            "    def wake_up(self, path):\n"
            "        states = torch.load(path)\n"
            "        for name, t in states.items():\n"
            "            setattr(self.pool, name, t.to(self.pool.device))\n"
            "\n"
            "    def step(self, g):\n"
            "        self.pool.g_cache[0] = g\n",
            [("RL005", 12)],
        ),
        # the entries are cast first
        (
            "def restore(path, shape):\n"
            "    cache = ReplayCache(shape)\n"
            "    for name, t in torch.load(path).items():\n"
            "        setattr(cache, name, t.float())\n"
            "    return cache\n",
            [],
        ),
        # not loaded: a mapping handed over in memory keeps whatever its maker chose
        (
            "def adopt(cache, rings):\n"
            "    for name, t in rings.items():\n"
            "        setattr(cache, name, t)\n"
            "    return cache.g_cache\n",
            [],
        ),
        # an object that holds no gate cache
        (
            "def restore(config, path):\n"
            "    for name, value in torch.load(path).items():\n"
            "        setattr(config, name, value)\n"
            "    return config\n",
            [],
        ),
    ],
)
def test_setattr_over_a_loaded_mapping(body: str, expected: list[tuple[str, int]]) -> None:
    assert _found(_CACHE + body) == expected


def test_the_fix_casts_the_gate_entry_only() -> None:
    source = _CACHE + (
        "def restore(path, shape):\n"
        "    cache = ReplayCache(shape)\n"
        "    for name, t in torch.load(path).items():\n"
        "        setattr(cache, name, t)\n"
        "    return cache\n"
    )
    fixed = Linter().fix(source)
    assert 'setattr(cache, name, t.to(torch.float32) if name == "g_cache" else t)' in fixed.source
    assert not fixed.remaining


_NAMES = 'KEYS = ("d_cache", "k_cache", "g_cache")\n\n'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("snapshot[name]", [("RL006", 8)]),
        ('[snapshot[f"{name}.{i}"] for i in range(layers)]', [("RL006", 8)]),
        ("[snapshot[name][i].float() for i in range(layers)]", []),
    ],
)
def test_a_loop_over_ring_names_storing_loaded_entries(
    value: str, expected: list[tuple[str, int]]
) -> None:
    source = (
        f"import torch\n\n{_NAMES}"
        "def restore(engine, path, layers):\n"
        "    snapshot = torch.load(path)\n"
        "    for name in KEYS:\n"
        f"        setattr(engine, name, {value})\n"
    )
    assert _found(source) == expected


def test_a_loop_over_ring_names_storing_fresh_float32_rings() -> None:
    source = (
        f"import torch\n\n{_NAMES}"
        "def fresh(engine, shape):\n"
        "    rings = {name: torch.zeros(shape, dtype=torch.float32) for name in KEYS}\n"
        "    for name in KEYS:\n"
        "        setattr(engine, name, rings[name])\n"
    )
    assert _found(source) == []
