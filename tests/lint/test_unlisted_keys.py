"""RL006's loops over keys the analysis cannot list: judged for the gate key when the code uses
the mapping as holding one, and loops over lists of rings that include the gate cache's."""

from __future__ import annotations

import textwrap
from pathlib import Path

from project_support import cli_rows, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding


def _check(source: str) -> list[Finding]:
    return Linter().check(textwrap.dedent(source), "example.py")


def test_a_mapping_read_under_the_gate_key_is_judged_for_it() -> None:
    source = """
        import torch

        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            return rings.get("g_cache")
        """
    findings = _check(source)
    assert [(f.location.row, f.code) for f in findings] == [(7, "RL006")]
    fixed = Linter().fix(textwrap.dedent(source), "example.py", unsafe=True).source
    assert 'dtype=torch.float32 if name == "g_cache" else dtype' in fixed


def test_a_test_that_leaves_the_gate_key_out_keeps_the_loop_quiet() -> None:
    assert not _check(
        """
        import torch

        def new_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                if name in ("d_cache", "k_cache"):
                    rings[name] = torch.zeros(shape, dtype=dtype)
                elif name == "g_cache":
                    rings[name] = torch.zeros(shape, dtype=torch.float32)
            return rings["g_cache"]
        """
    )


def test_a_float32_loop_and_an_unread_gate_key_are_left_alone() -> None:
    assert not _check(
        """
        import torch

        def float_rings(spec, n):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=torch.float32)
            return rings["g_cache"]

        def model_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            return rings["d_cache"]
        """
    )


def test_a_local_mapping_is_judged_by_its_own_function_only() -> None:
    assert not _check(
        """
        import torch

        def model_rings(spec, n, dtype):
            rings = {}
            for name, shape in spec.ring_shapes(n).items():
                rings[name] = torch.zeros(shape, dtype=dtype)
            return rings

        def other(rings):
            return rings["g_cache"]
        """
    )


def test_a_tensor_written_per_slot_is_a_copy_not_a_replacement() -> None:
    assert not _check(
        """
        import torch

        class Pool:
            def __init__(self, n, dtype):
                self.d_cache = torch.zeros(n, 4, dtype=dtype)
                self.g_cache = torch.zeros(n, 4, dtype=torch.float32)

            def swap_in(self, slot, saved):
                for name, ring in (("d_cache", self.d_cache), ("g_cache", self.g_cache)):
                    ring[slot] = saved[name]
        """
    )


def test_a_list_of_rings_among_a_loop_s_lists_is_judged_as_the_gate_cache() -> None:
    findings = _check(
        """
        import torch

        class Pool:
            def __init__(self, layers, dtype):
                self.dtype = dtype
                self.d_cache, self.g_cache = [], []
                for _ in range(layers):
                    self.d_cache.append(None)
                    self.g_cache.append(None)

            def ensure(self, layer, shapes):
                for kind, rings in zip(("dd", "gg"), (self.d_cache, self.g_cache)):
                    rings[layer] = torch.zeros(shapes[kind], dtype=self.dtype)
        """
    )
    assert [(f.location.row, f.code) for f in findings] == [(14, "RL006")]


def test_a_spread_into_a_record_of_another_module(tmp_path: Path) -> None:
    files = {
        "replaylint.toml": "",
        "pkg/__init__.py": "",
        "pkg/records.py": """
            from dataclasses import dataclass

            import torch

            @dataclass
            class LayerRings:
                state: torch.Tensor
                d_cache: torch.Tensor
                g_cache: torch.Tensor
            """,
        "pkg/pool.py": """
            import torch

            from .records import LayerRings

            def new_layer(spec, n, dtype):
                rings = {"state": torch.zeros(spec.state_shape(n), dtype=torch.float32)}
                for name, shape in spec.ring_shapes(n).items():
                    rings[name] = torch.zeros(shape, dtype=dtype)
                return LayerRings(**rings)

            def given_gate(spec, n, dtype, gate):
                rings = {}
                for name, shape in spec.ring_shapes(n).items():
                    rings[name] = torch.zeros(shape, dtype=dtype)
                return LayerRings(**rings, g_cache=gate)
            """,
    }
    write_tree(tmp_path, files)
    assert cli_rows(tmp_path, "--no-cache") == [("pkg/pool.py", 8, "RL006")]


_SET_BY_NAME = """
import torch


class Manager:
    def rebuild(self):
        engine = self.rollout.cache_engine
        for name, shape in engine.spec.shapes().items():
            dtype = torch.float32 if name == "ssm_state" else self.rollout.dtype
            setattr(engine, name, [torch.zeros(shape, dtype=dtype) for _ in range(2)])
{after}
    def step(self, i, g):
        engine = self.rollout.cache_engine
        engine.g_cache[i] = g
"""


def test_attributes_set_by_name_and_read_as_the_gate_cache_are_judged_for_it() -> None:
    # the loop's keys cannot be listed, but the module reads `engine.g_cache`: the gate ring
    # is among the attributes the loop sets, in the loop's dtype
    findings = _check(_SET_BY_NAME.format(after=""))
    assert [(f.location.row, f.code) for f in findings] == [(9, "RL006")]
    assert "whose dtype `torch.float32 if name" in findings[0].message


def test_attributes_the_function_sets_by_their_own_name_are_left_to_that_write() -> None:
    after = "        engine.g_cache = [torch.zeros(4, dtype=torch.float32) for _ in range(2)]\n"
    findings = _check(_SET_BY_NAME.format(after=after))
    assert [(f.location.row, f.code) for f in findings] == []
