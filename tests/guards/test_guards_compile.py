"""torch.compile: the float32 path traces into one graph; the other policies keep their meaning."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    GateCacheDtypeError,
    GateCacheDtypeWarning,
    fp32_gate_cache,
    guard_policy,
)

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def gate_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if w.category is GateCacheDtypeWarning]


def kernel(x: Any, g_cache: Any, row: int = 0) -> Any:
    g_cache[row] = x.sum() + g_cache[row]
    return x * 2


def test_float32_path_is_one_graph_without_breaks(
    decode_fn: Callable[..., Any], decode_args: Callable[..., list[Any]]
) -> None:
    guarded = fp32_gate_cache(decode_fn)
    explanation = torch._dynamo.explain(guarded)(*decode_args())
    assert explanation.graph_count == 1
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    eager_args, compiled_args = decode_args(), decode_args()
    guarded(*eager_args)
    torch.compile(guarded, fullgraph=True, backend="eager")(*compiled_args)
    assert torch.equal(eager_args[9], compiled_args[9])
    assert torch.equal(eager_args[10], compiled_args[10])


@pytest.mark.slow
def test_float32_path_compiles_with_inductor() -> None:
    guarded = fp32_gate_cache(kernel)
    g = torch.zeros(3)
    result = torch.compile(guarded, fullgraph=True)(torch.ones(4), g, 1)
    assert torch.equal(result, torch.full((4,), 2.0))
    assert g.tolist() == [0.0, 4.0, 0.0]


def test_cast_path_compiles_fullgraph_keeps_writes_and_warns_once(
    recorded: list[warnings.WarningMessage],
) -> None:
    guarded = fp32_gate_cache(policy="cast")(kernel)
    explanation = torch._dynamo.explain(guarded)(torch.ones(2), torch.zeros(3, dtype=BF16))
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(guarded, fullgraph=True)  # inductor: real generated code
    g = torch.zeros(3, dtype=BF16)
    compiled(torch.ones(2), g)
    compiled(torch.ones(2), g, 2)
    assert g.dtype is BF16
    assert g.tolist() == [2.0, 0.0, 2.0]
    shown = gate_warnings(recorded)
    assert len(shown) == 1  # emitted while tracing, once, although traced twice
    assert "policy 'cast' runs the call on a torch.float32 copy" in str(shown[0].message)


def test_cast_path_under_compile_keeps_writes_made_before_an_exception() -> None:
    @fp32_gate_cache(policy="cast")
    def failing(g_cache: Any) -> None:
        g_cache[0] = 3.0
        raise ValueError("after the write")

    g = torch.zeros(2, dtype=BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"after the write"):
            torch.compile(failing, backend="eager")(g)
    assert g.tolist() == [3.0, 0.0]


def test_warn_path_compiles_fullgraph_and_passes_the_tensor_through(
    recorded: list[warnings.WarningMessage],
) -> None:
    guarded = fp32_gate_cache(policy="warn")(lambda x, g_cache: g_cache.dtype is BF16)
    compiled = torch.compile(guarded, fullgraph=True, backend="eager")
    assert compiled(torch.ones(2), torch.zeros(3, dtype=BF16)) is True
    assert len(gate_warnings(recorded)) == 1


def test_reject_under_compile_raises_the_guard_error() -> None:
    guarded = fp32_gate_cache(kernel)
    with pytest.raises(GateCacheDtypeError, match=r"must be torch\.float32"):
        torch.compile(guarded, backend="eager")(torch.ones(2), torch.zeros(3, dtype=BF16))


def test_reject_under_fullgraph_surfaces_the_guard_message() -> None:
    # Dynamo turns an exception that leaves a fullgraph region into its own error type; the
    # guard's message is part of its text.
    guarded = fp32_gate_cache(kernel)
    with pytest.raises(Exception, match=r"argument 'g_cache' is torch\.bfloat16") as info:
        torch.compile(guarded, fullgraph=True, backend="eager")(
            torch.ones(2), torch.zeros(3, dtype=BF16)
        )
    assert "GateCacheDtypeError" in str(info.value) or isinstance(info.value, GateCacheDtypeError)
    assert "argument 'g_cache' is torch.bfloat16" in str(info.value)


def test_guard_policy_block_under_compile_still_applies() -> None:
    # ContextVar reads are a graph break for dynamo, so inside a guard_policy() block the policy
    # lookup runs eagerly; the result is still right (not with fullgraph=True: documented).
    guarded = fp32_gate_cache(kernel)
    g = torch.zeros(3, dtype=BF16)
    compiled = torch.compile(guarded, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with guard_policy("cast"):
            compiled(torch.ones(2), g)
        assert g.tolist() == [2.0, 0.0, 0.0]
        with pytest.raises(GateCacheDtypeError):
            compiled(torch.ones(2), g)
        with guard_policy("warn"):
            compiled(torch.ones(2), g)
        assert g.tolist() == [4.0, 0.0, 0.0]


@pytest.mark.parametrize("policy", ["cast", "warn"])
def test_dynamic_shapes_with_a_wrong_dtype_warn_once_and_run(
    policy: str, recorded: list[warnings.WarningMessage]
) -> None:
    guarded = fp32_gate_cache(policy=policy)(kernel)  # type: ignore[call-overload]
    compiled = torch.compile(guarded, dynamic=True, backend="eager")
    for size in (3, 5):
        g = torch.zeros(size, dtype=BF16)
        assert compiled(torch.ones(2), g, 1).tolist() == [2.0, 2.0]
        assert g.dtype is BF16
        assert g.tolist() == [0.0, 2.0] + [0.0] * (size - 2)
    assert len(gate_warnings(recorded)) == 1


def test_dynamic_shapes_cast_with_inductor_fullgraph(
    recorded: list[warnings.WarningMessage],
) -> None:
    compiled = torch.compile(fp32_gate_cache(policy="cast")(kernel), dynamic=True, fullgraph=True)
    g = torch.zeros(4, dtype=BF16)
    compiled(torch.ones(3), g, 2)
    assert g.tolist() == [0.0, 0.0, 3.0, 0.0]


def test_torchscript_refuses_to_drop_the_guard() -> None:
    def step(x: torch.Tensor, g_cache: torch.Tensor) -> torch.Tensor:
        return x + g_cache

    guarded = fp32_gate_cache(step)
    with pytest.raises(TypeError, match=r"torch\.jit\.script cannot keep the dtype guard") as info:
        torch.jit.script(guarded)
    assert "step()" in str(info.value)
    assert "torch.compile" in str(info.value)


def test_torchscript_refuses_a_guarded_callee_of_a_scripted_function() -> None:
    def outer(x: torch.Tensor, g_cache: torch.Tensor) -> torch.Tensor:
        return guarded_callee(x, g_cache)

    with pytest.raises(TypeError, match=r"torch\.jit\.script cannot keep the dtype guard"):
        torch.jit.script(outer)


@fp32_gate_cache
def guarded_callee(x: torch.Tensor, g_cache: torch.Tensor) -> torch.Tensor:
    return x + g_cache


def test_compiled_cast_copies_back_only_the_changed_elements(
    recorded: list[warnings.WarningMessage],
) -> None:
    g = torch.full((3,), 1 / 3, dtype=torch.float64)
    compiled = torch.compile(fp32_gate_cache(policy="cast")(kernel))
    compiled(torch.ones(2), g, 1)
    assert g[1].item() == pytest.approx(2 + 1 / 3, rel=1e-6)
    assert g[0].item() == 1 / 3  # exact float64 value, not its float32 rounding
    assert g[2].item() == 1 / 3


def test_compiled_cast_refuses_a_narrowing_it_cannot_represent(
    recorded: list[warnings.WarningMessage],
) -> None:
    # The range check reads values, so it runs in a graph break (not under fullgraph=True).
    compiled = torch.compile(fp32_gate_cache(policy="cast")(kernel), backend="eager")
    big = torch.tensor([1.0, 1e300, 0.0], dtype=torch.float64)
    with pytest.raises(GateCacheDtypeError, match=r"1 of 3 values are outside the range"):
        compiled(torch.ones(2), big)
    assert big.tolist() == [1.0, 1e300, 0.0]
    fine = torch.zeros(3, dtype=torch.float64)
    compiled(torch.ones(2), fine)
    assert fine.tolist() == [2.0, 0.0, 0.0]
