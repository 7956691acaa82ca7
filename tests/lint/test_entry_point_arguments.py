"""RL007's gate-cache arguments passed through ``*`` (a tuple, a list, a record, a slice of one
with literal bounds) and allocated with a dtype that is not provably float32 under no gate-cache
name: reported where the dtype is chosen, with the call that passes it."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter

_HEAD = """
import torch
from typing import NamedTuple


class Bufs(NamedTuple):
    state: torch.Tensor
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor


def kda_replayssm_decode(q, a, b, A_log, dt_bias, scale, state, d_cache, k_cache, g_cache, out, slots, pos):
    ...

"""


def _rows(body: str) -> list[tuple[int, str]]:
    source = _HEAD + textwrap.dedent(body)
    return [(f.location.row, f.code) for f in Linter().check(source, "example.py")]


@pytest.mark.parametrize(
    "body",
    [
        """
        def step(x, m, n, dt):
            rings = (torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt))
            state = torch.zeros(n, dtype=torch.float32)
            kda_replayssm_decode(x, x, x, m.A_log, m.dt_bias, 1.0, state, *rings, x, x, x)
        """,
        """
        def step(x, m, n, dt):
            bufs = Bufs(torch.zeros(n, dtype=torch.float32), torch.zeros(n, dtype=dt),
                        torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt))
            kda_replayssm_decode(x, x, x, m.A_log, m.dt_bias, 1.0, bufs.state, *bufs[1:4], x, x, x)
        """,
    ],
)
def test_an_unnamed_gate_ring_of_a_model_dtype(body: str) -> None:
    rows = _rows(body)
    assert [code for _, code in rows] == ["RL007"]
    # reported at the allocation that chooses the dtype (the last ring of the tuple or record)
    line = (_HEAD + textwrap.dedent(body)).splitlines()[rows[0][0] - 1]
    assert line.rstrip().endswith("torch.zeros(n, dtype=dt))")
    fixed = Linter().fix(_HEAD + textwrap.dedent(body), "example.py").source
    assert "torch.zeros(n, dtype=torch.float32))" in fixed.split("def step", 1)[1]


def test_named_and_float32_gate_rings_are_left_to_their_own_checks() -> None:
    assert (
        _rows(
            """
        def named(x, m, n, dt):
            g_cache = torch.zeros(n, dtype=torch.float32)
            rings = (torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt), g_cache)
            kda_replayssm_decode(x, x, x, m.A_log, m.dt_bias, 1.0, x, *rings, x, x, x)

        def float_rings(x, m, n, dt):
            bufs = Bufs(x, torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt),
                        torch.zeros(n, dtype=torch.float32))
            kda_replayssm_decode(x, x, x, m.A_log, m.dt_bias, 1.0, bufs.state, *bufs[1:4], x, x, x)
        """
        )
        == []
    )
