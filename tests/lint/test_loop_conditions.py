"""Tests a loop decides per name: local flags set from the loop's name, membership in a named
collection of this module or another, and the fields of a record read through ``_asdict()``."""

from __future__ import annotations

import textwrap
from pathlib import Path

from project_support import lint_in_project

from replaylint.lint.engine import Linter


def _rows(source: str) -> list[tuple[int, str]]:
    text = textwrap.dedent(source).lstrip("\n")
    return sorted((f.location.row, f.code) for f in Linter().check(text, "m.py"))


_EXPORT = """
import torch

RING_BUFFERS = ("ssm_state", "d_cache", "k_cache", "g_cache")
FP32_KEYS = {keys}

def export(module, dtype):
    state_dict = {{}}
    for name in RING_BUFFERS:
        buffer = getattr(module, name)
        keep = name in FP32_KEYS or not buffer.is_floating_point()
        state_dict[name] = buffer.clone() if keep else buffer.to(dtype)
    return state_dict
"""


def test_a_flag_set_from_the_loop_name_keeps_the_gate_cache_it_names() -> None:
    assert _rows(_EXPORT.format(keys='("ssm_state", "g_cache")')) == []


def test_a_flag_whose_collection_lacks_the_gate_cache_leaves_its_cast() -> None:
    assert _rows(_EXPORT.format(keys='("ssm_state",)')) == [(11, "RL006")]


def test_a_flag_set_by_a_test_call_decides_a_module_buffer_loop() -> None:
    source = """
    import torch
    from torch import nn

    class Pool(nn.Module):
        def __init__(self, n, dtype):
            super().__init__()
            self.dtype = dtype
            self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        def swap_out(self):
            out = {{}}
            for name, buf in self.named_buffers():
                exact = name.endswith({kept})
                out[name] = buf if exact else buf.to(self.dtype)
            return out
    """
    assert _rows(source.format(kept='("g_cache", "state")')) == []
    assert _rows(source.format(kept='"state"')) == [(14, "RL004")]


def test_membership_in_an_imported_collection_is_decided_by_its_strings(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/names.py": 'FP32_RINGS = ("ssm_state", "g_cache")\n',
        "pkg/export.py": """
            import torch

            from pkg.names import FP32_RINGS

            def export(pool, dtype):
                out = {}
                for name in ("d_cache", "k_cache", "g_cache"):
                    ring = getattr(pool, name)
                    out[name] = ring.clone() if name in FP32_RINGS else ring.to(dtype)
                return out
            """,
    }
    assert lint_in_project(tmp_path, files, "pkg/export.py") == []
    files["pkg/names.py"] = 'FP32_RINGS = ("ssm_state",)\n'
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/export.py")]
    assert rows == [(9, "RL006")]


_RECORD = """
from typing import NamedTuple

import torch

class KernelRings(NamedTuple):
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor

def kernel(*, d_cache, k_cache, g_cache):
    return d_cache

def step(x, cache, d, k, g):
    {binding}
    ring_kwargs = {{name: t.to(x.dtype) for name, t in rings._asdict().items()}}
    return kernel(**ring_kwargs)
"""


def test_the_fields_of_an_annotated_local_record_are_its_asdict_keys() -> None:
    binding = "rings: KernelRings = cache.kernel_rings()"
    assert _rows(_RECORD.format(binding=binding)) == [(15, "RL006")]


def test_the_fields_of_a_local_record_built_here_are_its_asdict_keys() -> None:
    binding = "rings = KernelRings(d, k, g)"
    assert _rows(_RECORD.format(binding=binding)) == [(15, "RL006")]


def test_a_local_of_no_known_record_gives_no_keys() -> None:
    binding = "rings = cache.kernel_rings()"
    assert _rows(_RECORD.format(binding=binding)) == []
