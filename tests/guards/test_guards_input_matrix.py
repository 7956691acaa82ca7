"""Every odd input against every policy of ``@fp32_gate_cache``, as one table.

Inputs: a non-tensor, meta, sparse, complex and zero-size tensors, in float32 and not. The guard
checks the dtype only: device checks are the kernel's (tests/kernels/test_validation.py), and a
tensor on another device is passed, or cast on its own device, like any other.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    DtypeGuardWarning,
    GateCacheDtypeError,
    fp32_gate_cache,
)

PASS, CAST, WARN = "pass", "cast", "warn"

INPUTS: dict[str, Callable[[], Any]] = {
    "list": lambda: [0.0, 1.0],
    "meta-float32": lambda: torch.empty(2, 3, device="meta"),
    "meta-bfloat16": lambda: torch.empty(2, 3, device="meta", dtype=torch.bfloat16),
    "sparse-float32": lambda: torch.ones(2, 2).to_sparse(),
    "sparse-bfloat16": lambda: torch.ones(2, 2, dtype=torch.bfloat16).to_sparse(),
    "complex64": lambda: torch.zeros(2, dtype=torch.complex64),
    "zero-size-float32": lambda: torch.zeros(0, 4),
    "zero-size-bfloat16": lambda: torch.zeros(0, 4, dtype=torch.bfloat16),
}

NOT_A_TENSOR = r"must be a torch\.Tensor of dtype torch\.float32; got builtins\.list"
# (input, policy) -> PASS / CAST / WARN, or the error message's pattern.
EXPECTED: dict[tuple[str, str], str] = {
    **{("list", policy): NOT_A_TENSOR for policy in ("reject", "cast", "warn")},
    **{
        (name, policy): PASS
        for name in INPUTS
        if "float32" in name
        for policy in ("reject", "cast", "warn")
    },
    ("meta-bfloat16", "reject"): r"'g_cache' is torch\.bfloat16",
    ("meta-bfloat16", "cast"): CAST,
    ("meta-bfloat16", "warn"): WARN,
    ("sparse-bfloat16", "reject"): r"'g_cache' is torch\.bfloat16",
    ("sparse-bfloat16", "cast"): r"cannot convert it to torch\.float32.*torch\.sparse_coo tensor",
    ("sparse-bfloat16", "warn"): WARN,
    ("complex64", "reject"): r"'g_cache' is torch\.complex64",
    ("complex64", "cast"): r"cannot convert it to torch\.float32.*torch\.complex64 is complex",
    ("complex64", "warn"): WARN,
    ("zero-size-bfloat16", "reject"): r"'g_cache' is torch\.bfloat16",
    ("zero-size-bfloat16", "cast"): CAST,
    ("zero-size-bfloat16", "warn"): WARN,
    **{(name, "off"): PASS for name in INPUTS},
}


@pytest.mark.parametrize("policy", ["reject", "cast", "warn", "off"])
@pytest.mark.parametrize("name", list(INPUTS))
def test_every_odd_input_under_every_policy(name: str, policy: str) -> None:
    expected = EXPECTED[(name, policy)]
    value = INPUTS[name]()
    seen: list[Any] = []

    @fp32_gate_cache(policy=policy)  # type: ignore[call-overload]
    def step(x: Any, g_cache: Any) -> str:
        seen.append(g_cache)
        return "ran"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if expected not in (PASS, CAST, WARN):
            with pytest.raises(GateCacheDtypeError, match=expected):
                step(0, value)
            assert seen == []  # refused before the function ran
            return
        assert step(0, value) == "ran"
    guard_warnings = [w for w in caught if issubclass(w.category, DtypeGuardWarning)]
    [given] = seen
    if expected == CAST:
        assert given is not value
        assert given.dtype is torch.float32
        assert given.device == value.device  # the copy stays on the caller's device
        assert given.shape == value.shape
        assert value.dtype is torch.bfloat16  # the caller's tensor keeps its dtype
        assert len(guard_warnings) == 1
    else:
        assert given is value
        assert len(guard_warnings) == (1 if expected == WARN else 0)


def test_the_table_covers_every_input_and_policy() -> None:
    assert set(EXPECTED) == {
        (name, policy) for name in INPUTS for policy in ("reject", "cast", "warn", "off")
    }
