"""Decoration: where the guarded parameter is found, what the wrapper keeps, what fails early."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    DtypeGuardError,
    GateCacheDtypeError,
    fp32_gate_cache,
    require_dtypes,
)

F32 = torch.float32
BF16 = torch.bfloat16
NAMES = [
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "d_cache", "k_cache",
    "g_cache", "out", "ssm_state_indices", "write_pos",
]  # fmt: skip


def test_import_path_and_bare_decorator_on_the_sglang_signature(
    decode_fn: Callable[..., Any], decode_args: Callable[..., list[Any]]
) -> None:
    guarded = fp32_gate_cache(decode_fn)
    args = decode_args()
    out, state = guarded(*args)
    assert out is args[10]
    assert state is args[6]
    assert args[9][0, 0, 0, 0].item() == 5.0  # the kernel ran and wrote into the float32 cache


@pytest.mark.parametrize("style", ["positional", "keyword", "mixed", "all-options"])
def test_gate_cache_is_found_however_it_is_passed(
    style: str, decode_fn: Callable[..., Any], decode_args: Callable[..., list[Any]]
) -> None:
    guarded = fp32_gate_cache(decode_fn)

    def call(args: list[Any]) -> Any:
        if style == "positional":
            return guarded(*args)
        if style == "keyword":
            return guarded(**dict(zip(NAMES, args, strict=True)))
        if style == "mixed":
            return guarded(*args[:5], **dict(zip(NAMES[5:], args[5:], strict=True)))
        return guarded(*args, None, True, lower_bound=-5.0)

    good = decode_args()
    call(good)
    assert good[9][0, 0, 0, 0].item() == 5.0
    bad = decode_args(BF16)
    with pytest.raises(GateCacheDtypeError, match=r"'g_cache' is torch\.bfloat16"):
        call(bad)
    assert bad[9].abs().sum().item() == 0.0  # rejected before the kernel ran


def test_wrapper_keeps_name_doc_module_signature_and_wrapped(decode_fn: Callable[..., Any]) -> None:
    guarded = fp32_gate_cache(decode_fn)
    assert guarded.__wrapped__ is decode_fn  # type: ignore[attr-defined]
    assert guarded.__name__ == decode_fn.__name__
    assert guarded.__qualname__ == decode_fn.__qualname__
    assert guarded.__doc__ == decode_fn.__doc__
    assert guarded.__module__ == decode_fn.__module__
    assert inspect.signature(guarded) == inspect.signature(decode_fn)
    assert typing.get_type_hints(guarded) == typing.get_type_hints(decode_fn)


def test_defaults_reach_the_function_as_the_same_objects() -> None:
    sentinel_position = object()
    sentinel_keyword = object()
    seen: dict[str, object] = {}

    def step(
        g_cache: Any, option: object = sentinel_position, *, flag: object = sentinel_keyword
    ) -> None:
        seen.update(option=option, flag=flag)

    fp32_gate_cache(step)(torch.zeros(1))
    assert seen == {"option": sentinel_position, "flag": sentinel_keyword}


def test_positional_only_keyword_only_and_variadic_parameters_are_forwarded() -> None:
    seen: list[Any] = []

    def step(x: Any, g_cache: Any, /, *rest: Any, gate: Any, **extra: Any) -> None:
        seen.append((x, g_cache, rest, gate, extra))

    guarded = require_dtypes(g_cache=F32, gate=F32)(step)
    g, gate = torch.zeros(1), torch.zeros(2)
    guarded(1, g, 2, 3, gate=gate, more=4)
    assert seen == [(1, g, (2, 3), gate, {"more": 4})]
    with pytest.raises(DtypeGuardError, match=r"'g_cache' is torch\.bfloat16"):
        guarded(1, g.bfloat16(), gate=gate)
    with pytest.raises(DtypeGuardError, match=r"'gate' is torch\.float16"):
        guarded(1, g, 2, gate=gate.half())
    with pytest.raises(TypeError, match=r"positional"):  # Python's own binding errors still apply
        guarded(1, g_cache=g, gate=gate)


def test_parameters_named_like_the_generated_internals_work() -> None:
    def step(_rl_fn: int, _rl_slow: int, g_cache: Any, __rl_ok0: int = 3) -> int:
        return _rl_fn + _rl_slow + __rl_ok0

    guarded = fp32_gate_cache(step)
    assert guarded(1, 2, torch.zeros(1)) == 6
    with pytest.raises(GateCacheDtypeError):
        guarded(1, 2, torch.zeros(1, dtype=BF16))


def test_fast_path_calls_once_and_returns_the_functions_result() -> None:
    calls: list[Any] = []
    result = object()

    def step(g_cache: Any) -> object:
        calls.append(g_cache)
        return result

    g = torch.zeros(2)
    assert fp32_gate_cache(step)(g) is result
    assert calls == [g]


class Ring:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    @fp32_gate_cache
    def step(self, x: Any, g_cache: Any) -> Any:
        self.seen.append(g_cache)
        return self

    @staticmethod
    @fp32_gate_cache
    def static_under(x: Any, g_cache: Any) -> Any:
        return g_cache

    @fp32_gate_cache
    @staticmethod
    def static_over(x: Any, g_cache: Any) -> Any:
        return g_cache

    @classmethod
    @fp32_gate_cache
    def class_under(cls, x: Any, g_cache: Any) -> Any:
        return cls

    @fp32_gate_cache
    @classmethod
    def class_over(cls, x: Any, g_cache: Any) -> Any:
        return cls


class SubRing(Ring):
    pass


def test_methods_account_for_self() -> None:
    ring = Ring()
    g = torch.zeros(1)
    assert ring.step(0, g) is ring
    assert ring.step(0, g_cache=g) is ring
    assert Ring.step(ring, 0, g) is ring
    assert ring.seen == [g, g, g]
    with pytest.raises(GateCacheDtypeError, match=r"Ring\.step\(\): argument 'g_cache'"):
        ring.step(0, g.bfloat16())
    with pytest.raises(GateCacheDtypeError):
        ring.step(0, g_cache=g.bfloat16())


@pytest.mark.parametrize("name", ["static_under", "static_over"])
def test_static_methods_under_or_over_the_guard(name: str) -> None:
    g = torch.zeros(1)
    for owner in (Ring, Ring(), SubRing):
        method = getattr(owner, name)
        assert method(0, g) is g
        assert method(0, g_cache=g) is g
        with pytest.raises(GateCacheDtypeError, match=f"Ring.{name}"):
            method(0, g.half())
    assert isinstance(inspect.getattr_static(Ring, name), staticmethod)
    assert list(inspect.signature(getattr(Ring, name)).parameters) == ["x", "g_cache"]


@pytest.mark.parametrize("name", ["class_under", "class_over"])
def test_class_methods_under_or_over_the_guard(name: str) -> None:
    g = torch.zeros(1)
    assert getattr(SubRing, name)(0, g) is SubRing
    assert getattr(Ring(), name)(0, g_cache=g) is Ring
    with pytest.raises(GateCacheDtypeError):
        getattr(SubRing, name)(0, g.bfloat16())


def test_callable_objects_and_partials_are_guarded_by_their_signature() -> None:
    class Kernel:
        def __call__(self, x: Any, g_cache: Any) -> Any:
            return x

    guarded_object = fp32_gate_cache(Kernel())
    assert guarded_object(1, torch.zeros(1)) == 1
    with pytest.raises(GateCacheDtypeError, match=r"^test_.*\.Kernel\(\): argument 'g_cache'"):
        guarded_object(1, torch.zeros(1, dtype=BF16))

    def step(scale: int, g_cache: Any, out: Any) -> Any:
        return scale

    guarded_partial = fp32_gate_cache(functools.partial(step, 7))
    assert guarded_partial(torch.zeros(1), None) == 7
    with pytest.raises(GateCacheDtypeError, match=r"^functools\.partial\(test_.*\.step\)\(\)"):
        guarded_partial(g_cache=torch.zeros(1, dtype=BF16), out=None)


def test_guards_stack_and_both_apply(
    decode_fn: Callable[..., Any], decode_args: Callable[..., list[Any]]
) -> None:
    guarded = require_dtypes(ssm_state_indices=torch.int32)(fp32_gate_cache(decode_fn))
    assert inspect.signature(guarded) == inspect.signature(decode_fn)
    guarded(*decode_args())
    with pytest.raises(GateCacheDtypeError):
        guarded(*decode_args(BF16))
    args = decode_args()
    args[11] = args[11].long()
    with pytest.raises(DtypeGuardError, match=r"'ssm_state_indices' is torch\.int64"):
        guarded(*args)


def test_configured_decorator_is_reusable() -> None:
    guard = fp32_gate_cache(policy="reject", arg="ring")

    def one(ring: Any) -> int:
        return 1

    def two(x: Any, ring: Any) -> int:
        return 2

    assert guard(one)(torch.zeros(1)) == 1
    assert guard(two)(0, torch.zeros(1)) == 2
    with pytest.raises(GateCacheDtypeError, match=r"two\(\): argument 'ring'"):
        guard(two)(0, torch.zeros(1, dtype=BF16))


# ---- errors at decoration time --------------------------------------------------------------


def test_missing_parameter_fails_at_decoration_with_the_parameter_list() -> None:
    def step(x: Any, gate: Any) -> None:
        pass

    with pytest.raises(TypeError, match=r"step\(\) has no parameter 'g_cache'") as info:
        fp32_gate_cache(step)
    assert "(x, gate)" in str(info.value)
    assert "arg='<name>'" in str(info.value)
    with pytest.raises(TypeError, match=r"no parameter 'idx'") as info:
        require_dtypes(idx=torch.int32)(step)
    assert "arg=" not in str(info.value)


@pytest.mark.parametrize("kind", ["*", "**"])
def test_variadic_parameters_cannot_be_guarded(kind: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def step(x, {kind}g_cache): pass", namespace)
    with pytest.raises(TypeError, match=rf"cannot guard \{kind[0]}.*g_cache of step\(\)"):
        fp32_gate_cache(namespace["step"])


def test_non_callables_and_positional_options_are_refused() -> None:
    with pytest.raises(TypeError, match=r"got str 'cast'.*policy='cast'"):
        fp32_gate_cache("cast")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"decorates functions"):
        require_dtypes(x=F32)(property(lambda self: 0))  # type: ignore[call-overload]


def test_coroutine_and_generator_functions_are_refused() -> None:
    async def coroutine(g_cache: Any) -> None:
        pass

    def generator(g_cache: Any) -> Any:
        yield g_cache

    for fn in (coroutine, generator):
        with pytest.raises(TypeError, match=r"coroutine or generator function"):
            fp32_gate_cache(fn)


def test_bad_options_fail_at_decoration() -> None:
    with pytest.raises(ValueError, match=r"one of 'reject', 'cast', 'warn' or 'off'; got 'strict'"):
        fp32_gate_cache(policy="strict")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"got int 3"):
        fp32_gate_cache(policy=3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"name of the gate-cache parameter"):
        fp32_gate_cache(arg="g cache")
    with pytest.raises(TypeError, match=r"a parameter named 'policy' cannot be guarded"):
        require_dtypes(policy=F32)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"at least one parameter=dtype"):
        require_dtypes()
    with pytest.raises(TypeError, match=r"require_dtypes\(x=...\) takes a torch.dtype.*'float32'"):
        require_dtypes(x="float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"non-empty tuple"):
        require_dtypes(x=())


def test_policy_names_are_case_and_space_insensitive() -> None:
    def step(g_cache: Any) -> Any:
        return g_cache

    g = torch.zeros(1, dtype=BF16)
    assert fp32_gate_cache(policy=" OFF ")(step)(g) is g  # type: ignore[call-overload]


@fp32_gate_cache
def module_level_step(g_cache: Any) -> Any:
    return g_cache.dtype


def test_guarded_functions_pickle_by_reference() -> None:
    import pickle

    restored = pickle.loads(pickle.dumps(module_level_step))
    assert restored is module_level_step
    assert pickle.loads(pickle.dumps(Ring.step)) is Ring.step


def test_public_names_report_the_public_module() -> None:
    import replaylint.guards as guards

    for name in guards.__all__:
        value = getattr(guards, name)
        if isinstance(value, type):
            assert value.__module__ == "replaylint.guards", name
