"""What each policy does with a wrong dtype, and what every kind of odd input gets."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    DtypeGuardError,
    DtypeGuardWarning,
    GateCacheDtypeError,
    GateCacheDtypeWarning,
    fp32_gate_cache,
    require_dtypes,
)

F32 = torch.float32
BF16 = torch.bfloat16


@pytest.fixture
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning, unfiltered: duplicates must come from the guard, not be hidden by Python."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def guard_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, DtypeGuardWarning)]


def ring_step(g_cache: Any, row: int = 0, value: float = 1.5) -> Any:
    """Writes one ring row in place, like the decode kernel, and reports what it was given."""
    g_cache[row] = value
    return g_cache.dtype


# ---- reject ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.complex64, torch.bool],
)
def test_reject_names_function_argument_dtypes_reason_and_fix(dtype: Any) -> None:
    calls: list[Any] = []

    @fp32_gate_cache
    def decode(x: Any, g_cache: Any) -> None:
        calls.append(g_cache)

    with pytest.raises(GateCacheDtypeError) as info:
        decode(0, torch.zeros(2, dtype=dtype))
    message = str(info.value)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, DtypeGuardError)
    assert message.startswith(
        "test_reject_names_function_argument_dtypes_reason_and_fix.<locals>.decode(): "
    )
    assert f"argument 'g_cache' is {dtype}" in message
    assert "must be torch.float32" in message
    assert "exponentiated" in message  # why, in one clause
    assert "allocate g_cache as torch.float32" in message
    assert "replaylint --fix" in message
    assert "policy='cast'" in message
    assert "REPLAYLINT_GUARD=cast" in message
    assert calls == []


def test_require_dtypes_reject_message_is_generic() -> None:
    @require_dtypes(ssm_state_indices=torch.int32)
    def step(ssm_state_indices: Any) -> None:
        pass

    with pytest.raises(DtypeGuardError) as info:
        step(torch.zeros(2, dtype=torch.int64))
    assert not isinstance(info.value, GateCacheDtypeError)
    assert "'ssm_state_indices' is torch.int64, but it must be torch.int32. Fix: create " in str(
        info.value
    )


# ---- cast ------------------------------------------------------------------------------------


def test_cast_runs_on_float32_and_copies_writes_back(
    recorded: list[warnings.WarningMessage],
) -> None:
    step = fp32_gate_cache(policy="cast")(ring_step)
    g = torch.zeros(4, dtype=BF16)
    assert step(g, 2) is F32  # the function saw a float32 tensor
    assert g.dtype is BF16
    assert g.tolist() == [0.0, 0.0, 1.5, 0.0]
    step(g, 0, value=2.0)
    assert g.tolist() == [2.0, 0.0, 1.5, 0.0]


def test_cast_warns_once_per_function_and_dtype_at_the_callers_line(
    recorded: list[warnings.WarningMessage],
) -> None:
    first = fp32_gate_cache(policy="cast")(ring_step)
    second = fp32_gate_cache(policy="cast")(ring_step)
    first(torch.zeros(2, dtype=BF16))
    first(torch.zeros(2, dtype=BF16))
    first(torch.zeros(2, dtype=torch.float16))
    first(torch.zeros(2))
    second(torch.zeros(2, dtype=BF16))
    shown = guard_warnings(recorded)
    assert [w.category for w in shown] == [GateCacheDtypeWarning] * 3
    assert ["torch.bfloat16" in str(w.message) for w in shown] == [True, False, True]
    assert all(w.filename == __file__ for w in shown)
    text = str(shown[0].message)
    assert "ring_step(): argument 'g_cache' is torch.bfloat16" in text
    assert "runs the call on a torch.float32 copy and copies the elements it changes back" in text
    assert "precision is lost" in text
    assert "replaylint --fix" in text


def test_cast_from_float64_warns_about_the_copy_not_about_precision(
    recorded: list[warnings.WarningMessage],
) -> None:
    g = torch.zeros(2, dtype=torch.float64)
    fp32_gate_cache(policy="cast")(ring_step)(g)
    assert g.tolist() == [1.5, 0.0]
    (shown,) = guard_warnings(recorded)
    assert "computes with the values rounded to torch.float32" in str(shown.message)
    assert "precision is lost" not in str(shown.message)


def test_cast_keeps_writes_made_before_an_exception(
    recorded: list[warnings.WarningMessage],
) -> None:
    @fp32_gate_cache(policy="cast")
    def failing(g_cache: Any) -> None:
        g_cache[0] = 3.0
        raise RuntimeError("kernel failed after writing row 0")

    g = torch.zeros(2, dtype=BF16)
    with pytest.raises(RuntimeError, match=r"kernel failed"):
        failing(g)
    assert g.tolist() == [3.0, 0.0]  # as it would be without the guard


def test_cast_writes_through_a_strided_view_into_a_pool(
    recorded: list[warnings.WarningMessage],
) -> None:
    pool = torch.zeros(4, 3, 2, dtype=BF16)
    view = pool[1:3, :, 1]  # non-contiguous, offset into the pool
    fp32_gate_cache(policy="cast")(ring_step)(view, 1)
    expected = torch.zeros(4, 3, 2, dtype=BF16)
    expected[2, :, 1] = 1.5
    assert torch.equal(pool, expected)


def test_cast_returns_the_callers_tensor_where_the_function_returned_its_argument(
    recorded: list[warnings.WarningMessage],
) -> None:
    @fp32_gate_cache(policy="cast")
    def step(g_cache: Any, out: Any) -> Any:
        g_cache.add_(1)
        return g_cache, [g_cache, out], out

    g, out = torch.zeros(2, dtype=BF16), torch.zeros(1)
    returned = step(g, out)
    assert returned[0] is g
    assert returned[2] is out
    assert returned[1][0] is not g  # only the top level is handed back; nested lists are left as is

    @fp32_gate_cache(policy="cast")
    def identity(g_cache: Any) -> Any:
        return g_cache

    assert identity(g) is g
    assert isinstance(fp32_gate_cache(policy="cast")(lambda g_cache: [g_cache])(g), list)


def test_cast_makes_one_copy_of_a_tensor_passed_twice(
    recorded: list[warnings.WarningMessage],
) -> None:
    @require_dtypes(x=F32, y=F32, policy="cast")
    def step(x: Any, y: Any) -> bool:
        x.add_(1)
        y.add_(1)
        return x is y

    g = torch.zeros(2, dtype=BF16)
    assert step(g, g) is True
    assert g.tolist() == [2.0, 2.0]


def test_cast_converts_to_the_first_allowed_dtype_and_between_integers(
    recorded: list[warnings.WarningMessage],
) -> None:
    @require_dtypes(idx=torch.int32, state=(torch.bfloat16, torch.float32), policy="cast")
    def step(idx: Any, state: Any) -> Any:
        idx.add_(1)
        return idx.dtype, state.dtype

    idx = torch.zeros(2, dtype=torch.int64)
    assert step(idx, torch.zeros(1, dtype=torch.float16)) == (torch.int32, torch.bfloat16)
    assert idx.tolist() == [1, 1]
    assert step(torch.zeros(1, dtype=torch.int32), torch.zeros(1)) == (torch.int32, F32)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (torch.zeros(2, dtype=torch.complex64), "torch.complex64 is complex"),
        (torch.zeros(2, dtype=torch.int64), "torch.int64 is integer"),
        (torch.zeros(2, dtype=torch.bool), "torch.bool is boolean"),
        (torch.zeros(2, 2, dtype=BF16).to_sparse(), "torch.sparse_coo tensor"),
    ],
    ids=["complex", "integer", "bool", "sparse"],
)
def test_cast_refuses_what_it_cannot_convert_or_copy_back(value: Any, reason: str) -> None:
    calls: list[Any] = []

    @fp32_gate_cache(policy="cast")
    def step(g_cache: Any) -> None:
        calls.append(g_cache)

    with pytest.raises(
        GateCacheDtypeError, match=r"policy 'cast' cannot convert it to torch\.float32"
    ) as info:
        step(value)
    assert reason in str(info.value)
    assert "allocate g_cache as torch.float32" in str(info.value)
    assert calls == []


# ---- warn and off ----------------------------------------------------------------------------


def test_warn_passes_the_tensor_through_and_warns_once(
    recorded: list[warnings.WarningMessage],
) -> None:
    seen: list[Any] = []

    @fp32_gate_cache(policy="warn")
    def step(g_cache: Any) -> None:
        seen.append(g_cache)

    g = torch.zeros(2, dtype=BF16)
    step(g)
    step(g)
    assert seen == [g, g]
    assert seen[0] is g
    (shown,) = guard_warnings(recorded)
    assert shown.category is GateCacheDtypeWarning
    assert shown.filename == __file__
    assert "Policy 'warn' passes it through unchanged" in str(shown.message)
    assert "should be torch.float32" in str(shown.message)


def test_require_dtypes_warns_with_the_general_category(
    recorded: list[warnings.WarningMessage],
) -> None:
    require_dtypes(x=torch.int32, policy="warn")(lambda x: None)(torch.zeros(1))
    (shown,) = guard_warnings(recorded)
    assert shown.category is DtypeGuardWarning


def test_off_checks_nothing(recorded: list[warnings.WarningMessage]) -> None:
    seen: list[Any] = []
    step = fp32_gate_cache(policy="off")(lambda g_cache: seen.append(g_cache))
    for value in (torch.zeros(1, dtype=BF16), None, [1.0], "text"):
        step(value)
    assert [type(v) for v in seen] == [torch.Tensor, type(None), list, str]
    assert guard_warnings(recorded) == []


# ---- odd inputs ------------------------------------------------------------------------------


class DuckTensor:
    dtype = torch.float32


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "got None. 'g_cache' may be None only when its default is None"),
        ([0.0, 1.0], "got builtins.list. Pass the tensor itself."),
        ((0.0,), "got builtins.tuple"),
        (1.5, "got builtins.float"),
        (DuckTensor(), "DuckTensor"),
    ],
    ids=["None", "list", "tuple", "float", "duck-typed"],
)
@pytest.mark.parametrize("policy", ["reject", "cast", "warn"])
def test_non_tensors_get_a_clear_type_error(value: Any, shown: str, policy: str) -> None:
    step = fp32_gate_cache(policy=policy)(lambda x, g_cache: None)  # type: ignore[call-overload]
    with pytest.raises(
        GateCacheDtypeError, match=r"must be a torch\.Tensor of dtype torch\.float32"
    ) as info:
        step(0, value)
    assert shown in str(info.value)


def test_numpy_arrays_get_a_conversion_hint() -> None:
    np = pytest.importorskip("numpy")
    step = fp32_gate_cache(lambda g_cache: None)
    with pytest.raises(
        GateCacheDtypeError, match=r"numpy.ndarray\. Convert NumPy arrays with torch.from_numpy"
    ):
        step(np.zeros(2, dtype=np.float32))


def test_none_is_accepted_only_where_the_default_is_none() -> None:
    @require_dtypes(force_flush=torch.int32, write_pos=torch.int32)
    def step(write_pos: Any, force_flush: Any = None) -> Any:
        return force_flush

    pos = torch.zeros(1, dtype=torch.int32)
    assert step(pos) is None
    assert step(pos, None) is None
    flush = torch.zeros(1, dtype=torch.int32)
    assert step(pos, force_flush=flush) is flush
    with pytest.raises(DtypeGuardError, match=r"'force_flush' is torch\.int64"):
        step(pos, flush.long())
    with pytest.raises(DtypeGuardError, match=r"'write_pos' must be a torch\.Tensor"):
        step(None)


def test_tensor_subclasses_pass_on_their_dtype() -> None:
    parameter = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    assert fp32_gate_cache(lambda g_cache: g_cache)(parameter) is parameter
    with pytest.raises(GateCacheDtypeError):
        fp32_gate_cache(lambda g_cache: g_cache)(parameter.detach().bfloat16())


def test_meta_tensors_are_checked_by_dtype(recorded: list[warnings.WarningMessage]) -> None:
    step = fp32_gate_cache(lambda g_cache: g_cache)
    meta = torch.empty(3, 4, device="meta")
    assert step(meta) is meta
    with pytest.raises(GateCacheDtypeError, match=r"torch\.bfloat16"):
        step(meta.bfloat16())
    cast_step = fp32_gate_cache(policy="cast")(ring_step)
    meta_bf16 = torch.empty(3, 4, device="meta", dtype=BF16)
    assert cast_step(meta_bf16) is F32
    assert meta_bf16.device.type == "meta"
    assert meta_bf16.dtype is BF16


def test_the_guard_checks_dtype_not_device(recorded: list[warnings.WarningMessage]) -> None:
    # Device checks belong to the kernel's contract; the guard passes a float32 tensor on any
    # device, and the cast makes its float32 copy on the tensor's own device.
    devices: list[Any] = []

    @fp32_gate_cache(policy="cast")
    def step(x: Any, g_cache: Any) -> None:
        devices.append(g_cache.device)

    step(torch.zeros(1), torch.empty(2, device="meta"))
    step(torch.zeros(1), torch.empty(2, device="meta", dtype=torch.float16))
    assert [d.type for d in devices] == ["meta", "meta"]


def test_zero_size_tensors(recorded: list[warnings.WarningMessage]) -> None:
    step = fp32_gate_cache(lambda g_cache: g_cache.numel())
    assert step(torch.zeros(0, 4)) == 0
    with pytest.raises(GateCacheDtypeError):
        step(torch.zeros(0, 4, dtype=BF16))
    empty = torch.zeros(0, 4, dtype=BF16)
    assert fp32_gate_cache(policy="cast")(lambda g_cache: g_cache.dtype)(empty) is F32


def test_sparse_tensors_are_checked_by_dtype() -> None:
    step = fp32_gate_cache(lambda g_cache: g_cache)
    sparse = torch.zeros(2, 2).to_sparse()
    assert step(sparse) is sparse
    with pytest.raises(GateCacheDtypeError, match=r"'g_cache' is torch\.bfloat16"):
        step(sparse.bfloat16())


def test_float32_path_consults_no_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    from replaylint.guards import _require

    def no_lookup(declared: str) -> str:
        raise AssertionError("the float32 path looked up the policy")

    step = fp32_gate_cache(lambda g_cache: g_cache.dtype)
    monkeypatch.setattr(_require, "effective_policy", no_lookup)
    assert step(torch.zeros(1)) is F32
    with pytest.raises(AssertionError, match="looked up the policy"):
        step(torch.zeros(1, dtype=BF16))  # the slow path does, which proves the patch is live


def test_fake_tensors_are_checked_by_dtype(recorded: list[warnings.WarningMessage]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    step = fp32_gate_cache(lambda g_cache: g_cache.dtype)
    cast_step = fp32_gate_cache(policy="cast")(ring_step)
    with FakeTensorMode():
        assert step(torch.empty(4, 2)) is F32
        with pytest.raises(GateCacheDtypeError):
            step(torch.empty(4, 2, dtype=BF16))
        assert cast_step(torch.empty(4, 2, dtype=BF16)) is F32


def test_cast_copy_back_follows_autograd_rules(recorded: list[warnings.WarningMessage]) -> None:
    # A leaf that requires grad cannot be written in place, with or without the guard.
    leaf = torch.zeros(2, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"leaf Variable that requires grad"):
        fp32_gate_cache(policy="cast")(ring_step)(leaf)
    with torch.no_grad():
        fp32_gate_cache(policy="cast")(ring_step)(leaf)
    assert leaf.tolist() == [1.5, 0.0]
