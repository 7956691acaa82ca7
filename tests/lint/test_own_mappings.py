"""Loops and comprehensions over a dict the class keeps on ``self`` (``self.rings.items()`` of
``self.rings = {...}``): its keys are the literal's, so a cast every entry shares reaches the gate
cache's (RL006)."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter

_POOL = textwrap.dedent(
    """\
    import torch


    class Pool:
        def __init__(self, shape, dtype):
            {rings}
            self.kv_dtype = dtype

        def for_kernel(self):
            return {body}
    """
)
_LITERAL = (
    'self.rings = {"d_cache": torch.zeros(shape, dtype=dtype), '
    '"g_cache": torch.zeros(shape, dtype=torch.float32)}'
)
_THROUGH_LOCAL = (
    'rings = {"d_cache": torch.zeros(shape, dtype=dtype), '
    '"g_cache": torch.zeros(shape, dtype=torch.float32)}\n        self.rings = rings'
)


def _findings(rings: str, body: str) -> list[tuple[str, str]]:
    source = _POOL.replace("{rings}", rings).replace("{body}", body)
    return [
        (f.code, source.splitlines()[f.location.row - 1].strip()) for f in Linter().check(source)
    ]


@pytest.mark.parametrize("rings", [_LITERAL, _THROUGH_LOCAL])
@pytest.mark.parametrize(
    "body",
    [
        "{name: buf.to(self.kv_dtype) for name, buf in self.rings.items()}",
        "{name: buf.half() for name, buf in self.rings.items()}",
    ],
)
def test_a_cast_every_entry_of_the_class_dict_shares_is_reported(rings: str, body: str) -> None:
    assert _findings(rings, body) == [("RL006", f"return {body}")]


@pytest.mark.parametrize(
    "body",
    [
        # the gate ring keeps its dtype, or is cast to float32 on its own
        '{name: buf if name == "g_cache" else buf.to(self.kv_dtype) for name, buf in self.rings.items()}',
        '{name: buf.to(self.kv_dtype) for name, buf in self.rings.items() if name != "g_cache"}',
        "{name: buf.to(device='cpu') for name, buf in self.rings.items()}",
    ],
)
def test_a_comprehension_that_spares_the_gate_cache_is_no_finding(body: str) -> None:
    assert _findings(_LITERAL, body) == []


def test_a_dict_the_class_binds_twice_is_not_read_by_its_keys() -> None:
    rings = _LITERAL + "\n        if shape is None:\n            self.rings = dict(shape=shape)"
    body = "{name: buf.half() for name, buf in self.rings.items()}"
    assert _findings(rings, body) == []
