"""Payloads a function builds only to hand to a method that copies them into tensors of its
own: their entries are a transfer format, not gate caches."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter

_POOL = textwrap.dedent(
    """\
    import torch


    class Pool:
        def __init__(self, shape):
            self.d_cache = torch.zeros(shape, dtype=torch.bfloat16)
            self.g_cache = torch.zeros(shape, dtype=torch.float32)
            self.rings = {{"d_cache": self.d_cache, "g_cache": self.g_cache}}

        def restore(self, snapshot, slots):
            {restore}


    def build(shape):
        pool = Pool(shape)
        payload = {{
            "d_cache": torch.full(shape, 0.25, dtype=torch.bfloat16),
            "g_cache": torch.full(shape, -0.125, dtype=torch.bfloat16),
        }}
        {use}
        return pool
    """
)
_COPIES = (
    "for name, t in snapshot.items():\n"
    "            ring = getattr(self, name)\n"
    "            ring[:, slots] = t.to(ring.dtype)",
    "self.g_cache.copy_(snapshot['g_cache'])\n        self.d_cache.copy_(snapshot['d_cache'])",
    "self.g_cache[..., :4] = snapshot['g_cache']",
)
_REPLACES = (
    "self.g_cache = snapshot['g_cache']",
    "for name, t in snapshot.items():\n            self.rings[name] = t",
)


def _rows(restore: str, use: str = "pool.restore(payload, [0])") -> list[tuple[str, str]]:
    source = _POOL.format(restore=restore, use=use)
    lines = source.splitlines()
    return [(f.code, lines[f.location.row - 1].strip()) for f in Linter().check(source)]


_GATE_ENTRY = ("RL001", '"g_cache": torch.full(shape, -0.125, dtype=torch.bfloat16),')


@pytest.mark.parametrize("restore", _COPIES)
def test_a_payload_only_copied_into_the_receiver_s_rings_is_no_gate_cache(restore: str) -> None:
    assert _rows(restore) == []


@pytest.mark.parametrize("restore", _REPLACES)
def test_a_payload_entry_the_receiver_keeps_is_judged(restore: str) -> None:
    assert _GATE_ENTRY in _rows(restore)


@pytest.mark.parametrize(
    "use",
    [
        "pool.restore(payload, [0])\n    pool.last = payload",  # also kept elsewhere
        "pool.adopt(payload)",  # a method the module does not define
    ],
)
def test_a_payload_used_otherwise_is_judged(use: str) -> None:
    assert _GATE_ENTRY in _rows(_COPIES[0], use)
