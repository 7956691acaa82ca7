"""Generator methods that walk a class's own tensors (``yield name, getattr(self, name)``): their
summary lists the items in order, and a loop over them in another module is judged per item."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from project_support import cli_rows, index_of, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding
from replaylint.lint.project.summaries import summarise
from replaylint.lint.project.yielded import yielded

_POOL = """
import torch


class RolloutPool:
    ring_names: tuple = ("delta_ring", "key_ring", "gate_ring")

    def __init__(self, shape, dtype):
        self.state = torch.zeros(shape)
        self.delta_ring = torch.zeros(shape, dtype=dtype)
        self.key_ring = torch.zeros(shape, dtype=dtype)
        self.gate_ring = torch.zeros(shape, dtype=torch.float32)

    def named_states(self):
        yield "state", self.state
        for name in self.ring_names:
            yield name, getattr(self, name)

    def step(self, kernel, q):
        return kernel(q, d_cache=self.delta_ring, k_cache=self.key_ring, g_cache=self.gate_ring)
"""

_STATE = """
from dataclasses import dataclass, fields
from typing import List

import torch


@dataclass
class ReplayState:
    d_cache: List[torch.Tensor]
    k_cache: List[torch.Tensor]
    g_cache: List[torch.Tensor]

    def named_rings(self):
        for item in fields(self):
            yield item.name, getattr(self, item.name)

    def layer(self, i, kernel):
        return kernel(d_cache=self.d_cache[i], k_cache=self.k_cache[i], g_cache=self.g_cache[i])
"""

# names no gate cache: only the walk's summary says that the gate ring is among the items
_DUMP = """
import torch

from pkg.pool import RolloutPool
from pkg.state import ReplayState


def wire_states(pool: RolloutPool, dtype: torch.dtype):
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in pool.named_states()}


def half_rings(state: ReplayState):
    out = {}
    for name, tensors in state.named_rings():
        out[name] = [t.half() for t in tensors]
    return out
"""

# the gate ring kept float32 by a test on its name: nothing to report
_KEPT = """
import torch

from pkg.pool import RolloutPool


def kept_rings(pool: RolloutPool, dtype: torch.dtype):
    return {
        name: t.to(torch.float32 if name == "gate_ring" else dtype)
        for name, t in pool.named_states()
        if t.is_floating_point()
    }
"""

_FILES = {
    "pkg/__init__.py": "",
    "pkg/pool.py": _POOL,
    "pkg/state.py": _STATE,
    "pkg/dump.py": _DUMP,
    "pkg/kept.py": _KEPT,
}


def _linter(root: Path) -> Linter:
    # the run lets the walking file through its pre-filter (see the last test); here every
    # file is analysed
    return Linter(project=index_of(write_tree(root, _FILES)), prefilter=False)


def _lint(root: Path, target: str) -> list[Finding]:
    return _linter(root).check((root / target).read_text(encoding="utf-8"), str(root / target))


def _method(source: str, name: str) -> tuple[ast.FunctionDef, ast.ClassDef]:
    cls = next(n for n in ast.parse(textwrap.dedent(source)).body if isinstance(n, ast.ClassDef))
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return method, cls


def test_the_items_of_a_loop_over_a_class_constant_are_listed_in_order() -> None:
    summary = summarise(textwrap.dedent(_POOL))
    assert summary is not None
    member = summary["names"]["RolloutPool"][2]["named_states"]
    items = [(item[1][0][1], item[1][1]) for item in member[2][1]]
    assert items == [
        ("state", ["self", "state"]),
        ("delta_ring", ["self", "delta_ring"]),
        ("key_ring", ["self", "key_ring"]),
        ("gate_ring", ["self", "gate_ring"]),
    ]


def test_a_walk_over_the_fields_of_a_dataclass_lists_each_field() -> None:
    summary = summarise(textwrap.dedent(_STATE))
    assert summary is not None
    member = summary["names"]["ReplayState"][2]["named_rings"]
    assert [item[1][0] for item in member[2][1]] == [
        ["const", "d_cache"],
        ["const", "k_cache"],
        ["const", "g_cache"],
    ]


def test_a_generator_whose_items_are_not_certain_is_not_summarised() -> None:
    conditional = """
    class Pool:
        names = ("d_ring", "g_ring")

        def walk(self, everything):
            for name in self.names:
                if everything or name != "g_ring":
                    yield name, getattr(self, name)
    """
    rebound = """
    class Pool:
        names = ("d_ring", "g_ring")

        def __init__(self, names):
            self.names = names

        def walk(self):
            for name in self.names:
                yield name, getattr(self, name)
    """
    for source in (conditional, rebound):
        method, cls = _method(source, "walk")
        assert yielded(method, cls, lambda node: ["node", ast.dump(node)]) is None


def test_a_loop_over_another_modules_walk_is_judged_per_item(tmp_path: Path) -> None:
    found = _lint(tmp_path, "pkg/dump.py")
    assert [(f.location.row, f.code) for f in found] == [(8, "RL006"), (14, "RL006")]
    first, second = (f.message for f in found)
    assert "`gate_ring`" in first
    assert "`pool.named_states()`" in first
    assert "`g_cache`" in second
    assert "`state.named_rings()`" in second
    assert _lint(tmp_path, "pkg/kept.py") == []


def test_the_fix_keeps_the_gate_ring_float32_and_the_rest_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "pkg/dump.py"
    linter = _linter(tmp_path)
    fixed = linter.fix(path.read_text(encoding="utf-8"), str(path), unsafe=True).source
    assert 't.to(torch.float32 if name == "gate_ring" else dtype)' in fixed
    assert '(t.to(torch.float32, copy=True) if name == "g_cache" else t.half())' in fixed


def test_the_pre_filter_lets_a_file_that_walks_learned_rings_through(tmp_path: Path) -> None:
    # ring names the run learns from the kernel calls, which the walking file never mentions
    learned = {
        **_FILES,
        "pkg/pool.py": _POOL.replace("gate_ring", "logdecay_ring"),
        "pkg/state.py": _STATE.replace("g_cache: List", "forget_ring: List").replace(
            "self.g_cache[i]", "self.forget_ring[i]"
        ),
    }
    write_tree(tmp_path, learned)
    rows = cli_rows(tmp_path, "--no-cache", "pkg")
    assert [row for row in rows if row[0] == "pkg/dump.py"] == [
        ("pkg/dump.py", 8, "RL006"),
        ("pkg/dump.py", 14, "RL006"),
    ]
