"""Every odd input, and every odd way of calling, against every policy of ``@fp32_gate_cache``.

Inputs: a non-tensor, meta, sparse, complex and zero-size tensors, in float32 and not. The guard
checks the dtype only: device checks are the kernel's (tests/kernels/test_validation.py), and a
tensor on another device is passed, or cast on its own device, like any other.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
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


# ---- how the guarded function is called and what it does with the tensor --------------------
#
# Each case: a bfloat16 gate cache used in a way that works without the guard (read-only calls,
# expanded views, autograd, inference mode, late-running bodies, dynamic compile, TorchScript),
# run under every policy. ERROR entries are the message's pattern; OK means the call behaves as
# it would unguarded and the caller's tensor holds exactly what it would hold unguarded.

OK = "ok"
REJECTED = r"'g_cache' is torch\.bfloat16, but the ReplaySSM gate cache must be torch\.float32"


def _read_only() -> tuple[Any, Callable[[], None]]:
    g = torch.tensor([0.1, 0.2, 0.3], dtype=torch.bfloat16)
    before = g.clone()

    def run(step: Callable[..., Any]) -> None:
        step(lambda g_cache: g_cache.sum())(g)
        assert torch.equal(g, before)

    return run, lambda: None


def _read_only_float64() -> tuple[Any, Callable[[], None]]:
    g = torch.tensor([0.1, 1 / 3, 1.0 + 2.0**-40], dtype=torch.float64)
    before = g.clone()

    def run(step: Callable[..., Any]) -> None:
        step(lambda g_cache: g_cache.sum())(g)
        assert torch.equal(g, before)  # bit-identical: not rounded to float32 on the way back

    return run, lambda: None


def _expanded() -> tuple[Any, Callable[[], None]]:
    base = torch.zeros(1, 3, dtype=torch.bfloat16)

    def run(step: Callable[..., Any]) -> None:
        def body(g_cache: Any) -> None:
            assert g_cache.stride()[0] == 0
            g_cache[1, 2] = 1.0  # lands in the one shared row, as without the guard

        step(body)(base.expand(4, 3))
        assert base.tolist() == [[0.0, 0.0, 1.0]]

    return run, lambda: None


def _autograd() -> tuple[Any, Callable[[], None]]:
    w = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)

    def run(step: Callable[..., Any]) -> None:
        g = w * 2  # non-leaf in the graph
        y = g * w  # saves g for backward
        (step(lambda g_cache: g_cache.sum())(g) + y.sum()).backward()
        assert w.grad is not None
        assert w.grad.tolist() == [6.0, 6.0, 6.0]

    return run, lambda: None


def _inference_mode() -> tuple[Any, Callable[[], None]]:
    with torch.inference_mode():
        g = torch.ones(3, dtype=torch.bfloat16)

    def run(step: Callable[..., Any]) -> None:
        assert step(lambda g_cache: g_cache.sum())(g).item() == 3.0

    return run, lambda: None


def _late(kind: str) -> Callable[[], tuple[Any, Callable[[], None]]]:
    def make() -> tuple[Any, Callable[[], None]]:
        g = torch.zeros(2, dtype=torch.bfloat16)
        results: list[Any] = []

        def body(g_cache: Any) -> Any:
            async def coroutine() -> None:
                g_cache[0] = 1.0

            def generator() -> Iterator[None]:
                g_cache[0] = 1.0
                yield

            return coroutine() if kind == "coroutine" else generator()

        def run(step: Callable[..., Any]) -> None:
            results.append(step(body)(g))
            assert g.tolist() == [0.0, 0.0]  # nothing ran yet

        def cleanup() -> None:
            for result in results:
                result.close()

        return run, cleanup

    return make


def _dynamic_compile() -> tuple[Any, Callable[[], None]]:
    torch._dynamo.reset()

    def run(step: Callable[..., Any]) -> None:
        def body(x: Any, g_cache: Any) -> Any:
            g_cache[1] = x.sum()
            return x * 2

        compiled = torch.compile(step(body), dynamic=True, backend="eager")
        for size in (3, 5):
            g = torch.zeros(size, dtype=torch.bfloat16)
            compiled(torch.ones(2), g)
            assert g.tolist() == [0.0, 2.0] + [0.0] * (size - 2)

    return run, torch._dynamo.reset


def _torchscript() -> tuple[Any, Callable[[], None]]:
    def run(step: Callable[..., Any]) -> None:
        def body(g_cache: torch.Tensor) -> torch.Tensor:
            return g_cache * 2

        torch.jit.script(step(body))

    return run, lambda: None


CALLS: dict[str, Callable[[], tuple[Any, Callable[[], None]]]] = {
    "read-only": _read_only,
    "read-only-float64": _read_only_float64,
    "expanded": _expanded,
    "autograd": _autograd,
    "inference-mode": _inference_mode,
    "coroutine-result": _late("coroutine"),
    "generator-result": _late("generator"),
    "dynamic-compile": _dynamic_compile,
    "torchscript": _torchscript,
}
SCRIPTING = r"torch\.jit\.script cannot keep the dtype guard"
CALL_EXPECTED: dict[tuple[str, str], str] = {
    **{(name, policy): OK for name in CALLS for policy in ("cast", "warn", "off")},
    **{(name, "reject"): REJECTED for name in CALLS},
    ("read-only-float64", "reject"): r"'g_cache' is torch\.float64",
    ("coroutine-result", "cast"): r"returned a coroutine",
    ("generator-result", "cast"): r"returned a generator",
    **{("torchscript", policy): SCRIPTING for policy in ("reject", "cast", "warn", "off")},
}


@pytest.mark.parametrize("policy", ["reject", "cast", "warn", "off"])
@pytest.mark.parametrize("name", list(CALLS))
def test_every_way_of_calling_under_every_policy(name: str, policy: str) -> None:
    expected = CALL_EXPECTED[(name, policy)]
    run, cleanup = CALLS[name]()

    def step(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fp32_gate_cache(policy=policy)(fn)  # type: ignore[call-overload, no-any-return]

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if expected == OK:
                run(step)
            else:
                with pytest.raises((GateCacheDtypeError, TypeError), match=expected):
                    run(step)
    finally:
        cleanup()


def test_the_call_table_covers_every_case_and_policy() -> None:
    assert set(CALL_EXPECTED) == {
        (name, policy) for name in CALLS for policy in ("reject", "cast", "warn", "off")
    }
