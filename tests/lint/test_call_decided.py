"""What a call of a helper or an entry of a nested table of the module gives the gate cache, with
the call's arguments (or the helper's defaults) deciding the helper's tests, and the table's keys
read through locals."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter

_MODULE = textwrap.dedent(
    """\
    import torch

    TABLE = {
        "bf16": {"delta": torch.bfloat16, "logdecay": torch.float32},
        "fp16": {"delta": torch.float16, "logdecay": torch.float16},
    }


    def to_layout(tensor, engine_dtype=None):
        if engine_dtype is None:
            return tensor.detach().clone()
        return tensor.detach().to(dtype=engine_dtype)


    def ring_dtypes(precision, dtype):
        if precision == "no":
            return torch.float32, torch.float32, torch.float32
        return dtype, dtype, dtype


    def build(shape, rings):
        {line}
        return g_cache
    """
)


_TABLE_ROWS = range(3, 7)


def _codes(line: str) -> list[str]:
    """The findings outside ``TABLE``: its fp16 row's own gate entry is reported at the table
    unless an allocation that reads it is (see the test after these)."""
    findings = Linter().check(_MODULE.replace("{line}", line))
    return [f.code for f in findings if f.location.row not in _TABLE_ROWS]


def test_the_narrow_gate_entry_of_the_table_is_reported_where_no_allocation_reads_it() -> None:
    unread = Linter().check(_MODULE.replace("{line}", "g_cache = None"))
    assert [(f.location.row, f.code) for f in unread] == [(5, "RL001")]
    line = 'g_cache = torch.zeros(shape, dtype=TABLE["fp16"]["logdecay"])'
    read = Linter().check(_MODULE.replace("{line}", line))
    assert [f.location.row for f in read if f.location.row in _TABLE_ROWS] == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('server = TABLE["bf16"]\n    g_cache = torch.zeros(shape, dtype=server["logdecay"])', []),
        ('g_cache = torch.zeros(shape, dtype=TABLE["bf16"]["logdecay"])', []),
        ('g_cache = torch.zeros(shape, dtype=TABLE["fp16"]["logdecay"])', ["RL001"]),
        (
            'server = TABLE["fp16"]\n    g_cache = torch.zeros(shape, dtype=server["logdecay"])',
            ["RL001"],
        ),
    ],
)
def test_an_entry_of_a_nested_table_is_read_through_its_keys(
    line: str, expected: list[str]
) -> None:
    assert _codes(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('g_cache = to_layout(rings["g_cache"])', []),  # the default takes the first return
        ('g_cache = to_layout(rings["g_cache"], torch.bfloat16)', ["RL004"]),
    ],
)
def test_a_helper_s_tests_on_its_defaults_and_arguments_pick_its_return(
    line: str, expected: list[str]
) -> None:
    assert _codes(line) == expected


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        (
            '_, _, g_dtype = ring_dtypes("no", torch.bfloat16)\n    g_cache = torch.zeros(shape, dtype=g_dtype)',
            False,
        ),
        (
            '_, _, g_dtype = ring_dtypes("bf16", torch.bfloat16)\n    g_cache = torch.zeros(shape, dtype=g_dtype)',
            True,
        ),
    ],
)
def test_a_tuple_a_helper_returns_is_unpacked_from_the_return_the_call_reaches(
    line: str, reported: bool
) -> None:
    assert bool(_codes(line)) is reported
