"""RL006 on a dict comprehension whose keys cannot be listed, read under a gate-cache key
(``rules/read_keys.py``)."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter

_POOL = """
import torch

from .specs import ring_specs


class Pool:
    def __init__(self, config, dtype):
        self.shapes = {{spec.name: spec.shape for spec in ring_specs(config)}}
        self.rings = {{name: torch.zeros(shape, dtype={dtype}) for name, shape in self.shapes.items()}}

    def layer(self, i):
        return self.rings["d_cache"][i], self.rings[{key}][i]
"""


def _source(dtype: str, key: str) -> str:
    return textwrap.dedent(_POOL.format(dtype=dtype, key=key)).lstrip("\n")


@pytest.mark.parametrize(
    ("dtype", "key", "flagged"),
    [
        ("dtype", '"g_cache"', True),  # one shared dtype, one entry read as the gate cache
        ("torch.float32", '"g_cache"', False),  # every entry float32
        ("dtype", '"k_cache"', False),  # no entry read as the gate cache
    ],
)
def test_a_mapping_read_under_a_gate_key(dtype: str, key: str, *, flagged: bool) -> None:
    findings = Linter().check(_source(dtype, key))
    assert [(f.code, f.location.row) for f in findings] == ([("RL006", 9)] if flagged else [])


def test_the_fix_makes_only_the_gate_entry_float32() -> None:
    fixed = Linter().fix(_source("dtype", '"g_cache"'), unsafe=True)
    assert 'dtype=torch.float32 if name == "g_cache" else dtype' in fixed.source
    assert not fixed.remaining
