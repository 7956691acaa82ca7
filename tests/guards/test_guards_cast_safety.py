"""Policy 'cast' never changes or loses the caller's data, and leaves read-only calls alone.

What the caller's tensor holds after a cast call is what it would hold had the function been
given it directly, element by element: elements the function did not change keep their exact
original values (float64 precision, out-of-range bits, NaN payloads), elements it changed take
the new value in the caller's dtype, and a call that changes nothing does not write the caller's
tensor at all. Casts that cannot represent the input are refused before the function runs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    DtypeGuardError,
    GateCacheDtypeError,
    GateCacheDtypeWarning,
    as_fp32_gate_cache,
    fp32_gate_cache,
    require_dtypes,
)

F32 = torch.float32
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GateCacheDtypeWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def read_only(g_cache: Any) -> Any:
    return g_cache.sum()


def write_row(g_cache: Any, row: int = 0, value: float = 1.5) -> None:
    g_cache[row] = value


# ---- narrowing: only what the function wrote is copied back ---------------------------------


def test_read_only_call_leaves_a_float64_cache_bit_identical() -> None:
    g = torch.tensor([0.1, 1 / 3, -2.0e-40, 1.0 + 2.0**-40], dtype=torch.float64)
    before = g.clone()
    fp32_gate_cache(policy="cast")(read_only)(g)
    assert torch.equal(g, before)  # not rounded to float32 on the way back


def test_a_write_to_one_row_leaves_the_other_rows_at_full_precision() -> None:
    g = torch.full((3, 2), 1 / 3, dtype=torch.float64)
    fp32_gate_cache(policy="cast")(write_row)(g, 1, 0.25)
    assert g[1].tolist() == [0.25, 0.25]
    assert g[0].tolist() == [1 / 3, 1 / 3]  # exact float64 thirds, not float32 ones
    assert g[2].tolist() == [1 / 3, 1 / 3]


def test_integer_narrowing_out_of_range_is_refused_before_the_call() -> None:
    calls: list[Any] = []

    @require_dtypes(write_pos=torch.int32, policy="cast")
    def step(write_pos: Any) -> None:
        calls.append(write_pos)

    pos = torch.tensor([5, 2**33 + 7, -(2**40)], dtype=torch.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DtypeGuardError, match=r"outside the range of torch\.int32") as info:
            step(pos)
    assert caught == []  # no "runs the call on a copy" warning for a call that did not run
    message = str(info.value)
    assert "2 of 3 values" in message
    assert "8589934599" in message  # an example of a value that does not fit
    assert "create write_pos with dtype=torch.int32" in message
    assert calls == []
    assert pos.tolist() == [5, 2**33 + 7, -(2**40)]


def test_integer_narrowing_in_range_is_cast_and_written_back() -> None:
    @require_dtypes(write_pos=torch.int32, policy="cast")
    def step(write_pos: Any) -> Any:
        write_pos.add_(1)
        return write_pos.dtype

    pos = torch.tensor([5, 2**31 - 2, -(2**31)], dtype=torch.int64)
    assert step(pos) is torch.int32
    assert pos.tolist() == [6, 2**31 - 1, -(2**31) + 1]


def test_float_overflow_is_refused_before_the_call() -> None:
    @require_dtypes(x=torch.float16, policy="cast")
    def step(x: Any) -> None:
        raise AssertionError("must not run")

    x = torch.tensor([1.0, 1e5, float("inf"), float("nan")])
    with pytest.raises(DtypeGuardError, match=r"outside the range of torch\.float16") as info:
        step(x)
    assert "1 of 4 values" in str(info.value)  # inf and nan are representable; 1e5 is not
    with pytest.raises(GateCacheDtypeError, match=r"outside the range of torch\.float32"):
        fp32_gate_cache(policy="cast")(read_only)(torch.tensor([1e300], dtype=torch.float64))
    # infinities and NaN convert exactly, so they are not refused
    fp32_gate_cache(policy="cast")(read_only)(
        torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    )


def test_writes_that_bypass_the_version_counter_are_copied_back() -> None:
    # A Triton or C++ kernel writes through the data pointer; autograd's version counter does
    # not see it. `.data` and NumPy views behave the same way on CPU.
    @fp32_gate_cache(policy="cast")
    def raw_kernel(g_cache: Any) -> None:
        g_cache.data[1] = 7.0
        g_cache.numpy()[2] = 9.0

    g = torch.zeros(4, dtype=BF16)
    raw_kernel(g)
    assert g.tolist() == [0.0, 7.0, 9.0, 0.0]


def test_a_write_of_nan_over_a_value_and_of_negative_zero_is_copied_back() -> None:
    @fp32_gate_cache(policy="cast")
    def step(g_cache: Any) -> None:
        g_cache[0] = float("nan")
        g_cache[1] = -0.0

    g = torch.zeros(3, dtype=BF16)
    step(g)
    assert torch.isnan(g[0])
    assert torch.signbit(g[1])
    assert g[2].item() == 0.0


def test_writes_through_another_view_of_the_same_pool_are_kept() -> None:
    # The function also holds the pool itself: what it writes there directly must not be
    # overwritten by stale values from the copy.
    pool = torch.zeros(2, 3, dtype=BF16)

    @fp32_gate_cache(policy="cast")
    def step(g_cache: Any, pool: Any) -> None:
        pool[0, 1] = 4.0
        g_cache[2] = 5.0

    step(pool[0], pool)
    assert pool[0].tolist() == [0.0, 4.0, 5.0]


# ---- read-only calls that work without the guard work with it -------------------------------


def test_read_only_call_on_an_expanded_cache() -> None:
    g = torch.zeros(1, 3, dtype=BF16).expand(4, 3)
    assert fp32_gate_cache(policy="cast")(read_only)(g).item() == 0.0


def test_an_expanded_cache_is_given_to_the_function_expanded() -> None:
    # Without the guard, a write to one row of an expanded tensor lands in its one shared row,
    # and a write to the whole tensor fails; both stay so under cast.
    base = torch.zeros(1, 3, dtype=BF16)
    g = base.expand(4, 3)

    @fp32_gate_cache(policy="cast")
    def step(g_cache: Any) -> Any:
        g_cache[2, 1] = 3.0
        return g_cache.stride()

    assert step(g) == (0, 1)
    assert base.tolist() == [[0.0, 3.0, 0.0]]
    with pytest.raises(RuntimeError, match=r"single memory location"):
        fp32_gate_cache(policy="cast")(lambda g_cache: g_cache.add_(1))(g)
    assert base.tolist() == [[0.0, 3.0, 0.0]]


def test_other_internally_overlapping_inputs_are_refused() -> None:
    overlapping = torch.zeros(6, dtype=BF16).as_strided((3, 3), (1, 1))
    with pytest.raises(GateCacheDtypeError, match=r"overlap"):
        fp32_gate_cache(policy="cast")(read_only)(overlapping)


def test_read_only_call_on_a_leaf_that_requires_grad_backpropagates() -> None:
    leaf = torch.ones(3, dtype=BF16, requires_grad=True)
    fp32_gate_cache(policy="cast")(read_only)(leaf).backward()
    assert leaf.grad is not None
    assert leaf.grad.tolist() == [1.0, 1.0, 1.0]


def test_read_only_call_on_a_non_leaf_in_a_graph_backpropagates() -> None:
    w = torch.ones(3, dtype=BF16, requires_grad=True)
    g = w * 2
    y = g * w  # saves g for backward
    total = fp32_gate_cache(policy="cast")(read_only)(g) + y.sum()
    total.backward()
    assert w.grad is not None
    assert w.grad.tolist() == [6.0, 6.0, 6.0]  # d/dw (2w + 2w^2) at w = 1


def test_read_only_call_on_a_tensor_saved_for_backward_keeps_backward_working() -> None:
    w = torch.ones(3, requires_grad=True)
    g = torch.full((3,), 2.0, dtype=BF16)
    y = (w * g).sum()  # saves g
    fp32_gate_cache(policy="cast")(read_only)(g)
    y.backward()
    assert w.grad is not None
    assert w.grad.tolist() == [2.0, 2.0, 2.0]


def test_a_write_to_a_leaf_that_requires_grad_fails_as_it_would_without_the_guard() -> None:
    leaf = torch.zeros(2, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        write_row(leaf)
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        fp32_gate_cache(policy="cast")(write_row)(leaf)
    with torch.no_grad():
        fp32_gate_cache(policy="cast")(write_row)(leaf)
    assert leaf.tolist() == [1.5, 0.0]


def test_read_only_call_on_an_inference_tensor_outside_inference_mode() -> None:
    with torch.inference_mode():
        g = torch.ones(3, dtype=BF16)
    assert fp32_gate_cache(policy="cast")(read_only)(g).item() == 3.0


def test_inference_tensor_inside_inference_mode_read_and_write() -> None:
    with torch.inference_mode():
        g = torch.zeros(3, dtype=BF16)
        assert fp32_gate_cache(policy="cast")(read_only)(g).item() == 0.0
        fp32_gate_cache(policy="cast")(write_row)(g, 2)
    assert g.tolist() == [0.0, 0.0, 1.5]


def test_a_write_to_an_inference_tensor_outside_inference_mode_fails_as_without_the_guard() -> None:
    with torch.inference_mode():
        plain, guarded = torch.zeros(3, dtype=BF16), torch.zeros(3, dtype=BF16)
    with pytest.raises(RuntimeError, match=r"[Ii]nplace update to inference tensor"):
        write_row(plain)
    with pytest.raises(RuntimeError, match=r"[Ii]nplace update to inference tensor"):
        fp32_gate_cache(policy="cast")(write_row)(guarded)


# ---- bodies that run after the call returns ---------------------------------------------------


class AsyncKernel:
    async def __call__(self, g_cache: Any) -> None:
        g_cache[0] = 1.0


def test_an_object_with_an_async_call_is_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"coroutine or generator function"):
        fp32_gate_cache(AsyncKernel())


def test_a_partial_of_a_coroutine_function_is_refused_at_decoration() -> None:
    async def body(x: Any, g_cache: Any) -> None:
        pass

    with pytest.raises(TypeError, match=r"coroutine or generator function"):
        fp32_gate_cache(functools.partial(body, 0))


def sync_wrapper_returning_a_coroutine(g_cache: Any) -> Any:
    async def body() -> None:
        g_cache[0] = 1.0

    return body()


def function_returning_a_generator(g_cache: Any) -> Any:
    def body() -> Iterator[None]:
        g_cache[0] = 1.0
        yield

    return body()


async def _async_body(g_cache: Any) -> None:
    g_cache[0] = 1.0


@functools.wraps(_async_body)
def wraps_wrapper_of_an_async_function(g_cache: Any) -> Any:
    return _async_body(g_cache)


@pytest.mark.parametrize(
    "fn",
    [
        sync_wrapper_returning_a_coroutine,
        wraps_wrapper_of_an_async_function,
        function_returning_a_generator,
    ],
    ids=["coroutine", "functools.wraps-coroutine", "generator"],
)
def test_a_late_running_result_under_cast_is_refused_not_lost(fn: Any) -> None:
    g = torch.zeros(2, dtype=BF16)
    with pytest.raises(GateCacheDtypeError, match=r"returned a (coroutine|generator)") as info:
        fp32_gate_cache(policy="cast")(fn)(g)
    assert "allocate g_cache as torch.float32" in str(info.value)
    assert g.tolist() == [0.0, 0.0]


def test_a_late_running_result_on_float32_is_returned_as_is() -> None:
    g = torch.zeros(2)
    result = fp32_gate_cache(policy="cast")(sync_wrapper_returning_a_coroutine)(g)
    assert inspect.iscoroutine(result)
    asyncio.run(result)
    assert g.tolist() == [1.0, 0.0]


def test_the_refused_coroutine_is_closed_without_a_never_awaited_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(GateCacheDtypeError):
            fp32_gate_cache(policy="cast")(sync_wrapper_returning_a_coroutine)(
                torch.zeros(2, dtype=BF16)
            )
        import gc

        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


# ---- as_fp32_gate_cache ------------------------------------------------------------------------


def test_as_fp32_gate_cache_from_float64_says_it_rounds_now(fresh_warnings: None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = as_fp32_gate_cache(torch.tensor([1 / 3], dtype=torch.float64))
    assert loaded.dtype is F32
    (shown,) = caught
    text = str(shown.message)
    assert "already rounded" not in text
    assert "rounds" in text
    assert "float64" in text


def test_as_fp32_gate_cache_refuses_float64_values_that_overflow_float32() -> None:
    with pytest.raises(GateCacheDtypeError, match=r"outside the range of torch\.float32"):
        as_fp32_gate_cache(torch.tensor([1.0, -1e39], dtype=torch.float64))
