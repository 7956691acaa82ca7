"""Which method makes a module's buffers, and module casts of an instance built right here.

A class that registers its caches in a later method (``setup_cache``) holds none right after
construction, so ``Transformer(args).to(torch.bfloat16)`` converts no gate buffer; once the
method has run on the instance (or when it is not known whether it has), the cast is reported.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.engine import Linter
from replaylint.lint.project.buffer_makers import CONSTRUCTION, buffer_makers


def _makers(source: str) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(source))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    return buffer_makers(cls)


def test_the_constructor_and_what_it_runs_make_buffers_at_construction() -> None:
    makers = _makers(
        """
        class Pool(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("state", torch.zeros(n))
                self._allocate(n)

            def _allocate(self, n):
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))
                self.k_cache = nn.Buffer(torch.zeros(n))

            def setup_cache(self, n):
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer(f"ring_{n}", torch.zeros(n))
        """
    )
    assert makers == {
        "state": CONSTRUCTION,
        "g_cache": CONSTRUCTION,
        "k_cache": CONSTRUCTION,
        "d_cache": "setup_cache",
        "ring_{n}": "setup_cache",
    }


def test_a_buffer_made_under_a_flag_and_by_a_later_method_is_made_later() -> None:
    makers = _makers(
        """
        class Attention(nn.Module):
            def __init__(self, args):
                super().__init__()
                if args.eager_cache:
                    self.register_buffer("cache_logdecay", torch.zeros(4))
                    self.register_buffer("cache_pos", torch.zeros(4, dtype=torch.int32))
                if args.scratch:
                    self._make_scratch()

            def _make_scratch(self):
                self.register_buffer("scratch", torch.zeros(4))

            def setup_cache(self, dtypes):
                self.register_buffer("cache_logdecay", torch.zeros(4, dtype=dtypes.logdecay))
        """
    )
    # only made under a flag of the constructor: made at construction, when asked
    assert makers["cache_pos"] == CONSTRUCTION
    # a conditional call of a method is no construction
    assert makers["scratch"] == "_make_scratch"
    assert makers["cache_logdecay"] == "setup_cache"


_MODEL = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        if args.eager_cache:
            self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

    def setup_cache(self, n):
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))


class Transformer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.layers = nn.ModuleList([Attention(args) for _ in range(2)])

    def setup_cache(self, n):
        for layer in self.layers:
            layer.setup_cache(n)
"""

_NEW = """
def build(args):
    model = Transformer(args).to(torch.bfloat16)
    model.setup_cache(4)
    other = Transformer(args)
    other.half()
    return model, other
"""

_SET_UP = """
def build(args):
    model = Transformer(args)
    model.setup_cache(4)
    model.to(torch.bfloat16)
    return model


def convert(model: Transformer):
    return model.half()
"""


def _rl004_rows(source: str) -> list[int]:
    found = Linter().check(textwrap.dedent(source), "model.py")
    return [f.location.row for f in found if f.code == "RL004"]


def test_a_new_instance_of_a_class_that_makes_its_gate_buffer_later_is_not_reported() -> None:
    assert _rl004_rows(_MODEL + _NEW) == []


def test_an_instance_whose_cache_method_ran_or_may_have_run_is_reported() -> None:
    lines = (_MODEL + _SET_UP).splitlines()
    expected = [
        i for i, line in enumerate(lines, 1) if ".to(torch.bfloat16)" in line or ".half()" in line
    ]
    assert _rl004_rows(_MODEL + _SET_UP) == expected


def test_a_class_that_makes_its_gate_buffer_at_construction_is_reported_when_new() -> None:
    eager = _MODEL.replace("        if args.eager_cache:\n    ", "")
    assert "if args.eager_cache" not in eager
    rows = _rl004_rows(eager + _NEW)
    assert len(rows) == 2


@pytest.mark.parametrize(("body", "reported"), [(_NEW, False), (_SET_UP, True)])
def test_a_class_of_another_module_follows_the_same_rule(
    tmp_path: Path, body: str, reported: bool
) -> None:
    loader = "import torch\nfrom pkg.modeling import Transformer\n" + textwrap.dedent(body)
    files = {"pkg/__init__.py": "", "pkg/modeling.py": _MODEL, "pkg/loader.py": loader}
    found = [f for f in lint_in_project(tmp_path, files, "pkg/loader.py") if f.code == "RL004"]
    assert bool(found) is reported
    if reported:
        lines = loader.splitlines()
        casts = {i for i, line in enumerate(lines, 1) if ".to(torch" in line or ".half()" in line}
        assert {f.location.row for f in found} == casts
