"""Mappings of rings a class keeps and rebuilds, loops keyed by a ring and a layer, and library
maps over the rings: what RL006 reads of them, across a project's modules."""

from __future__ import annotations

from pathlib import Path

from project_support import cli_rows, write_tree

_SHAPES = """
def ring_shapes(num_slots):
    return {"state": (num_slots, 4, 4), "d_cache": (num_slots, 8, 4), "g_cache": (num_slots, 8, 4)}
"""

_WRAPPER = """
import torch

from pkg.shapes import ring_shapes


class Wrapper:
    def __init__(self, num_slots, dtype):
        shapes = ring_shapes(num_slots)
        self.rings = {
            name: torch.zeros(shape, dtype=torch.float32 if name != "d_cache" else dtype)
            for name, shape in shapes.items()
        }

    def to_device(self, device):
        self.rings = {name: ring.to(device) for name, ring in self.rings.items()}

    def replay_args(self, dtype):
        return {name: ring.to(dtype) for name, ring in self.rings.items()}
"""


def test_an_attribute_rebuilt_with_its_own_keys_keeps_the_keys_of_its_comprehension(
    tmp_path: Path,
) -> None:
    # the comprehension over another module's shapes is read where it is written (`__init__`),
    # and the rebuild in `to_device` gives the attribute no other keys
    write_tree(
        tmp_path, {"pkg/__init__.py": "", "pkg/shapes.py": _SHAPES, "pkg/wrapper.py": _WRAPPER}
    )
    rows = cli_rows(tmp_path, "--no-cache", "pkg")
    assert ("pkg/wrapper.py", 18, "RL006") in rows
    assert [row for row in rows if row[0] == "pkg/wrapper.py"] == [("pkg/wrapper.py", 18, "RL006")]


def test_a_second_value_of_the_attribute_leaves_its_keys_unknown(tmp_path: Path) -> None:
    other = _WRAPPER.replace(
        "self.rings = {name: ring.to(device) for name, ring in self.rings.items()}",
        'self.rings = {"scratch": torch.zeros(4, device=device)}',
    )
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/shapes.py": _SHAPES, "pkg/wrapper.py": other})
    assert not [row for row in cli_rows(tmp_path, "--no-cache", "pkg") if row[2] == "RL006"]


def test_a_ring_keyed_with_its_layer_in_a_loop_over_an_imported_tuple(tmp_path: Path) -> None:
    names = 'RING_NAMES = ("delta_ring", "key_ring", "g_cache")\n'
    swap = """
import torch

from pkg.names import RING_NAMES


def swap_out(chat):
    arrays = {}
    for name in RING_NAMES:
        for layer, ring in enumerate(getattr(chat, name)):
            ring = ring.detach().cpu()
            arrays[f"{name}/{layer}"] = (ring.half() if ring.is_floating_point() else ring).numpy()
    return arrays
"""
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/names.py": names, "pkg/swap.py": swap})
    assert ("pkg/swap.py", 11, "RL006") in cli_rows(tmp_path, "--no-cache", "pkg")


def test_a_tree_map_over_a_mapping_another_module_returns(tmp_path: Path) -> None:
    helpers = """
import torch


def ring_kwargs(pool):
    return {"d_cache": pool.d_cache, "k_cache": pool.k_cache, "g_cache": pool.g_cache}
"""
    step = """
import torch
from torch.utils._pytree import tree_map

from pkg.helpers import ring_kwargs


def host_rings(pool, dtype):
    kwargs = ring_kwargs(pool)
    moved = tree_map(lambda t: t.cpu(), kwargs)
    return moved, tree_map(lambda t: t.to(dtype), kwargs)
"""
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": helpers, "pkg/step.py": step})
    rows = [row for row in cli_rows(tmp_path, "--no-cache", "pkg") if row[0] == "pkg/step.py"]
    assert rows == [("pkg/step.py", 10, "RL006")]
