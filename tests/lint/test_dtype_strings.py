"""Dtypes spelled as strings in configuration, and OmegaConf interpolations inside a literal."""

from __future__ import annotations

import libcst as cst
import pytest

from replaylint.lint.dataflow.dtype_strings import config_entries, float32_spelling, string_dtype


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("bf16", "bfloat16"),
        ("BFloat16", "bfloat16"),
        ("torch.half", "float16"),
        ("amp_fp16", "float16"),
        ("fp32", "float32"),
        ("float", "float32"),
        ("auto", None),
        ("int8", None),
        ("", None),
    ],
)
def test_a_string_names_a_floating_dtype(text: str, dtype: str | None) -> None:
    assert string_dtype(text) == dtype


@pytest.mark.parametrize(
    ("text", "spelled"),
    [("bf16", "fp32"), ("amp_bf16", "fp32"), ("bfloat16", "float32"), ("half", "float32"),
     ("torch.bfloat16", "torch.float32"), ("torch.half", "torch.float32")],
)  # fmt: skip
def test_float32_is_spelled_in_the_settings_vocabulary(text: str, spelled: str) -> None:
    assert float32_spelling(text) == spelled
    assert string_dtype(spelled) == "float32"


def _entries(source: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    root = cst.parse_expression(source)
    assert isinstance(root, cst.Dict)
    return {entry.key: (entry.dtype, entry.through) for entry in config_entries(root)}


def test_interpolations_are_followed_absolute_and_relative() -> None:
    found = _entries(
        """{
            "dtype": "bf16",
            "cache": {
                "ring": "${dtype}",
                "gate": "${cache.ring}",
                "sibling": "${.ring}",
                "parent": "${..dtype}",
                "state": "fp32",
            },
        }"""
    )
    assert found["gate"] == ("bfloat16", ("${cache.ring}", "${dtype}"))
    assert found["sibling"] == ("bfloat16", ("${.ring}", "${dtype}"))
    assert found["parent"] == ("bfloat16", ("${..dtype}",))
    assert found["state"] == ("float32", ())


@pytest.mark.parametrize(
    "value",
    [
        '"${missing}"',  # a key the literal does not hold
        '"${oc.env:DTYPE}"',  # a resolver
        '"${gate}"',  # a cycle
        '"${...too.far}"',  # above the root
        "DTYPE",  # not a string
    ],
)
def test_what_the_literal_does_not_settle_is_unknown(value: str) -> None:
    assert _entries(f'{{"gate": {value}, "other": "bf16"}}')["gate"] == (None, ())


def test_a_spread_or_a_repeated_key_may_override_the_entry() -> None:
    assert _entries('{"dtype": "bf16", **extra, "gate": "${dtype}"}')["gate"] == (None, ())
    assert _entries('{"dtype": "bf16", "dtype": "fp32", "gate": "${dtype}"}')["gate"] == (None, ())
