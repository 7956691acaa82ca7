"""Every argument check of the decode entry: a ValueError naming the argument, the expectation
and what was given (the gate cache's dtype is the guard's: GateCacheDtypeError)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import GateCacheDtypeError  # noqa: E402
from replaylint.kernels import (  # noqa: E402
    recurrent_decode_reference,
    replayssm_decode,
    replayssm_decode_reference,
)

B, H, HV, K, V, L, S = 3, 2, 4, 16, 16, 4, 5


def valid_args() -> dict[str, Any]:
    return {
        "mixed_qkv": torch.randn(B, 2 * H * K + HV * V),
        "a": torch.randn(B, HV, K),
        "b": torch.randn(B, HV),
        "A_log": torch.randn(HV),
        "dt_bias": torch.randn(HV, K),
        "scale": K**-0.5,
        "initial_state": torch.randn(S, HV, V, K),
        "d_cache": torch.randn(S, HV, L, V),
        "k_cache": torch.randn(S, H, L, K),
        "g_cache": torch.randn(S, HV, L, K),
        "out": torch.zeros(B, 1, HV, V),  # not empty(): NaN garbage would never compare equal
        "ssm_state_indices": torch.tensor([0, -1, 2], dtype=torch.int32),
        "write_pos": torch.tensor([0, 1, 3], dtype=torch.int32),
        "force_flush": torch.tensor([0, 0, 1], dtype=torch.int32),
        "use_qk_l2norm_in_kernel": True,
        "lower_bound": None,
    }


def _noncontig_last(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


def _transposed_copy(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


Mutation = Callable[[dict[str, Any]], None]


def _set(name: str, value: Callable[[], object]) -> Mutation:
    def mutate(args: dict[str, Any]) -> None:
        args[name] = value()

    return mutate


def _set_shaped(name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Mutation:
    if dtype.is_floating_point:
        return _set(name, lambda: torch.randn(*shape, dtype=dtype))
    return _set(name, lambda: torch.zeros(*shape, dtype=dtype))


W = 2 * H * K + HV * V
# (argument named in the message, mutation, what the message must mention)
CASES: list[tuple[str, Mutation, str]] = [
    ("mixed_qkv", _set("mixed_qkv", lambda: [1.0]), "torch.Tensor"),
    ("mixed_qkv", _set_shaped("mixed_qkv", (B, W, 1)), "2-D"),
    ("mixed_qkv", _set_shaped("mixed_qkv", (B, W + 1)), f"({B}, {W})"),
    ("mixed_qkv", _set_shaped("mixed_qkv", (B, W), torch.int32), "floating"),
    ("mixed_qkv", _set("mixed_qkv", lambda: _noncontig_last((B, W))), "contiguous last"),
    ("a", _set_shaped("a", (B, HV, K, 1)), "2 or 3-D"),
    ("a", _set_shaped("a", (B, HV, K + 1)), "[B, HV, K]"),
    ("a", _set_shaped("a", (B, HV * K + 1)), "[B, HV*K]"),
    ("a", _set_shaped("a", (B, HV, K), torch.int64), "floating"),
    ("a", _set("a", lambda: _transposed_copy(torch.randn(B, HV, K))), "contiguous"),
    ("b", _set_shaped("b", (B, HV + 1)), "[B, HV]"),
    ("b", _set_shaped("b", (B,)), "2-D"),
    ("b", _set_shaped("b", (B, HV), torch.int32), "floating"),
    ("A_log", _set_shaped("A_log", (HV, 1)), "1-D"),
    ("A_log", _set_shaped("A_log", (HV + 1,)), "[HV]"),
    ("A_log", _set_shaped("A_log", (HV,), torch.bfloat16), "float32"),
    ("dt_bias", _set_shaped("dt_bias", (HV, K + 1)), "[HV, K]"),
    ("dt_bias", _set_shaped("dt_bias", (HV * K + 1,)), "[HV*K]"),
    ("dt_bias", _set_shaped("dt_bias", (HV, K), torch.float16), "float32"),
    ("dt_bias", _set("dt_bias", lambda: _transposed_copy(torch.randn(HV, K))), "contiguous"),
    ("scale", _set("scale", lambda: "0.25"), "float"),
    ("scale", _set("scale", lambda: True), "float"),
    ("scale", _set("scale", lambda: float("nan")), "finite"),
    ("initial_state", _set_shaped("initial_state", (S, HV, V)), "4-D"),
    ("initial_state", _set_shaped("initial_state", (S, HV, V, K), torch.int32), "float32"),
    (
        "initial_state",
        _set("initial_state", lambda: _noncontig_last((S, HV, V, K))),
        "contiguous last",
    ),
    ("d_cache", _set_shaped("d_cache", (S, HV, L)), "4-D"),
    ("d_cache", _set_shaped("d_cache", (S, HV, 0, V)), ">= 1"),
    ("d_cache", _set_shaped("d_cache", (S + 1, HV, L, V)), "[slots, HV, L, V]"),
    ("d_cache", _set_shaped("d_cache", (S, HV, L, V + 1)), "[slots, HV, L, V]"),
    ("d_cache", _set_shaped("d_cache", (S, HV, L, V), torch.int32), "floating"),
    ("d_cache", _set("d_cache", lambda: _noncontig_last((S, HV, L, V))), "contiguous last"),
    ("k_cache", _set_shaped("k_cache", (S, 3, L, K)), "divides HV"),
    ("k_cache", _set_shaped("k_cache", (S - 1, H, L, K)), "[slots, H, L, K]"),
    ("k_cache", _set_shaped("k_cache", (S, H, L, K + 1)), "[slots, H, L, K]"),
    ("k_cache", _set_shaped("k_cache", (S, H, L, K), torch.bfloat16), "same dtype as d_cache"),
    ("k_cache", _set("k_cache", lambda: _noncontig_last((S, H, L, K))), "contiguous last"),
    ("g_cache", _set_shaped("g_cache", (S, HV, L)), "4-D"),
    ("g_cache", _set_shaped("g_cache", (S + 2, HV, L, K)), "[slots, HV, L, K]"),
    ("g_cache", _set("g_cache", lambda: _noncontig_last((S, HV, L, K))), "contiguous last"),
    ("out", _set_shaped("out", (B, HV, V)), "4-D"),
    ("out", _set_shaped("out", (B, 2, HV, V)), "[B, 1, HV, V]"),
    ("out", _set_shaped("out", (B, 1, HV, V), torch.int32), "floating"),
    ("out", _set("out", lambda: _transposed_copy(torch.empty(B, 1, HV, V))), "contiguous"),
    ("ssm_state_indices", _set_shaped("ssm_state_indices", (B,), torch.int64), "int32"),
    ("ssm_state_indices", _set_shaped("ssm_state_indices", (B + 1,), torch.int32), "[B]"),
    ("ssm_state_indices", _set_shaped("ssm_state_indices", (B, 1), torch.int32), "1-D"),
    ("write_pos", _set_shaped("write_pos", (B,), torch.int64), "int32"),
    ("write_pos", _set_shaped("write_pos", (B - 1,), torch.int32), "[B]"),
    ("force_flush", _set_shaped("force_flush", (B,), torch.bool), "int32"),
    ("force_flush", _set_shaped("force_flush", (B + 1,), torch.int32), "[B]"),
    ("use_qk_l2norm_in_kernel", _set("use_qk_l2norm_in_kernel", lambda: 1), "bool"),
    ("lower_bound", _set("lower_bound", lambda: 5.0), "negative"),
    ("lower_bound", _set("lower_bound", lambda: 0.0), "negative"),
    ("lower_bound", _set("lower_bound", lambda: float("-inf")), "negative"),
    ("lower_bound", _set("lower_bound", lambda: "-5"), "negative"),
    ("b", _set("b", lambda: torch.randn(B, HV, device="meta")), "device"),
    (
        "write_pos",
        _set("write_pos", lambda: torch.zeros(B, dtype=torch.int32, device="meta")),
        "device",
    ),
]


TENSOR_ARGUMENTS = (
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "d_cache", "k_cache", "g_cache",
    "out", "ssm_state_indices", "write_pos", "force_flush",
)  # fmt: skip


def _sparse(name: str) -> Mutation:
    def mutate(args: dict[str, Any]) -> None:
        args[name] = args[name].to_sparse()

    return mutate


def _complex(name: str) -> Mutation:
    def mutate(args: dict[str, Any]) -> None:
        args[name] = args[name].to(torch.complex64)

    return mutate


def _on_meta(name: str) -> Mutation:
    def mutate(args: dict[str, Any]) -> None:
        args[name] = args[name].to("meta")

    return mutate


# Every tensor argument: a non-tensor, a sparse tensor, and (all but the state, whose device is
# the reference) a tensor on another device; complex activations and state.
# (g_cache's type is the guard's at the kernel entry: test_non_tensor_gate_cache below.)
CASES += [
    (name, _set(name, lambda: [[0.0]]), "torch.Tensor")
    for name in TENSOR_ARGUMENTS
    if name != "g_cache"
]
CASES += [(name, _sparse(name), "dense (strided)") for name in TENSOR_ARGUMENTS]
CASES += [(name, _on_meta(name), "device") for name in TENSOR_ARGUMENTS if name != "initial_state"]
CASES += [(name, _complex(name), "floating") for name in ("mixed_qkv", "a", "b", "out", "d_cache")]
CASES += [
    ("initial_state", _complex("initial_state"), "float32"),
    ("A_log", _complex("A_log"), "float32"),
    ("dt_bias", _complex("dt_bias"), "float32"),
]


# The reference takes a float64 state (it is the high-precision oracle); the kernel does not.
KERNEL_ONLY: list[tuple[str, Mutation, str]] = [
    ("initial_state", _set_shaped("initial_state", (S, HV, V, K), torch.float64), "float32"),
]


@pytest.mark.parametrize(
    ("argument", "mutate", "mentions"),
    KERNEL_ONLY,
    ids=[f"{name}-kernel-only-{i}" for i, (name, _, _) in enumerate(KERNEL_ONLY)],
)
def test_kernel_only_violations(argument: str, mutate: Mutation, mentions: str) -> None:
    test_each_violation_names_the_argument(replayssm_decode, argument, mutate, mentions)


@pytest.mark.parametrize(
    ("argument", "mutate", "mentions"),
    CASES,
    ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)],
)
@pytest.mark.parametrize("entry", [replayssm_decode, replayssm_decode_reference])
def test_each_violation_names_the_argument(
    entry: Callable[..., object], argument: str, mutate: Mutation, mentions: str
) -> None:
    args = valid_args()
    mutate(args)
    with pytest.raises(ValueError, match="expected") as info:
        entry(**args)
    message = str(info.value)
    assert message.startswith(f"{argument}:"), message
    assert "got" in message
    assert mentions in message, message


@pytest.mark.parametrize("entry", [replayssm_decode, replayssm_decode_reference])
def test_meta_tensors_everywhere_are_refused_by_name(entry: Callable[..., object]) -> None:
    args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in valid_args().items()}
    with pytest.raises(ValueError, match=r"^initial_state: expected a tensor with data"):
        entry(**args)


def test_recurrent_reference_refuses_a_meta_state() -> None:
    args = valid_args()
    common = {k: args[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "out")}
    with pytest.raises(ValueError, match=r"^state: expected a tensor with data"):
        recurrent_decode_reference(
            **common,
            state=args["initial_state"].to("meta"),
            ssm_state_indices=args["ssm_state_indices"],
        )


def test_non_tensor_gate_cache() -> None:
    args = valid_args()
    args["g_cache"] = [[0.0]]
    with pytest.raises(GateCacheDtypeError, match=r"argument 'g_cache' must be a torch\.Tensor"):
        replayssm_decode(**args)
    with pytest.raises(ValueError, match=r"^g_cache: expected a torch\.Tensor, got list"):
        replayssm_decode_reference(**args)


def test_validation_runs_before_any_write() -> None:
    args = valid_args()
    snapshot = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    args["write_pos"] = args["write_pos"].to(torch.int64)
    with pytest.raises(ValueError, match="write_pos"):
        replayssm_decode(**args)
    for name, before in snapshot.items():
        if name != "write_pos":
            assert torch.equal(before, args[name]), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_entry_rejects_a_low_precision_gate_cache(dtype: torch.dtype) -> None:
    args = valid_args()
    args["g_cache"] = args["g_cache"].to(dtype)
    with pytest.raises(GateCacheDtypeError):
        replayssm_decode(**args)


def test_reference_rejects_a_low_precision_gate_cache() -> None:
    args = valid_args()
    args["g_cache"] = args["g_cache"].to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^g_cache: expected dtype in \{float32, float64\}"):
        replayssm_decode_reference(**args)


def test_reference_takes_float64_everywhere() -> None:
    args = {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in valid_args().items()
    }
    out, state = replayssm_decode_reference(**args)
    assert out.dtype == torch.float64
    assert state.dtype == torch.float64
    assert torch.isfinite(out).all()


def test_recurrent_reference_checks_its_arguments() -> None:
    args = valid_args()
    common = {k: args[k] for k in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "out")}
    idx = args["ssm_state_indices"]
    with pytest.raises(ValueError, match=r"^state: expected a 4-D tensor"):
        recurrent_decode_reference(**common, state=torch.randn(S, HV, V), ssm_state_indices=idx)
    bad = dict(common, mixed_qkv=torch.randn(B, W + 3))
    with pytest.raises(ValueError, match=r"^mixed_qkv: expected width 2\*H\*K \+ HV\*V"):
        recurrent_decode_reference(**bad, state=args["initial_state"], ssm_state_indices=idx)
    out, _ = recurrent_decode_reference(
        **common, state=args["initial_state"], ssm_state_indices=idx
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("policy", ["warn", "off"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64])
def test_kernel_entry_requires_a_floating_gate_cache_under_any_policy(
    policy: str, dtype: torch.dtype
) -> None:
    """A permissive guard policy lets a bf16 gate cache through; nothing lets a non-floating
    one through (the kernel would read its bits as floats)."""
    from replaylint.guards import guard_policy

    args = valid_args()
    args["g_cache"] = torch.zeros(S, HV, L, K, dtype=dtype)
    snapshot = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with (
        guard_policy(policy),  # type: ignore[arg-type]
        pytest.warns() if policy == "warn" else _no_warning_check(),
        pytest.raises(ValueError, match=r"^g_cache: expected a floating-point dtype, got"),
    ):
        replayssm_decode(**args)
    for name, before in snapshot.items():
        assert torch.equal(before, args[name]), name


def _no_warning_check() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _expanded(shape: tuple[int, ...]) -> torch.Tensor:
    """A pool view whose slots all share one slot's memory (slot stride 0)."""
    return torch.randn(1, *shape[1:]).expand(*shape)


@pytest.mark.parametrize(
    ("argument", "make"),
    [
        ("d_cache", lambda: _expanded((S, HV, L, V))),
        ("k_cache", lambda: _expanded((S, H, L, K))),
        ("g_cache", lambda: _expanded((S, HV, L, K))),
        ("initial_state", lambda: _expanded((S, HV, V, K))),
        # Zero stride on the ring axis: every ring row is one row.
        ("d_cache", lambda: torch.randn(S, HV, 1, V).expand(S, HV, L, V)),
        # A hand-made view whose slot stride is smaller than a slot: slots overlap.
        ("g_cache", lambda: torch.randn(S * L * K * 2).as_strided((S, HV, L, K), (K, L * K, K, 1))),
    ],
)
@pytest.mark.parametrize("entry", [replayssm_decode, replayssm_decode_reference])
def test_internally_overlapping_pool_views_are_refused(
    argument: str, make: Callable[[], torch.Tensor], entry: Callable[..., object]
) -> None:
    args = valid_args()
    args[argument] = make()
    with pytest.raises(ValueError, match=rf"^{argument}: expected a view whose elements do not"):
        entry(**args)


def test_strided_pool_views_that_do_not_overlap_are_accepted() -> None:
    """Views into a larger pool (slot stride past the slot, heads-major pools) are fine."""
    args = valid_args()
    big = torch.randn(S, HV + 2, V, K)
    args["initial_state"] = big[:, 1 : HV + 1]
    heads_major = torch.randn(HV, S, L, V)
    args["d_cache"] = heads_major.transpose(0, 1)
    ref = valid_args()
    for name in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "k_cache", "g_cache"):
        ref[name] = args[name]
    ref["initial_state"] = args["initial_state"].clone()
    ref["d_cache"] = args["d_cache"].clone()
    replayssm_decode_reference(**args)
    replayssm_decode_reference(**ref)
    assert torch.equal(args["out"], ref["out"])
    assert torch.equal(args["initial_state"], ref["initial_state"])


def test_a_repeated_signature_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run once per argument signature; new tensors with the same shapes, strides,
    dtypes and devices reuse them (the eager host path at small batch)."""
    from replaylint.kernels import _decode

    calls = []
    real = _decode.validate_decode_args

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_decode, "validate_decode_args", counting)
    monkeypatch.setattr(_decode, "_PREPARED", {})
    for _ in range(3):
        replayssm_decode(**valid_args())
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("argument", "value", "mentions"),
    [
        ("scale", True, r"^scale: expected a Python float"),  # True == 1 as a dict key
        ("use_qk_l2norm_in_kernel", 1, r"^use_qk_l2norm_in_kernel: expected a bool"),
        ("b", lambda: torch.randn(B, HV).to(torch.int32), r"^b: expected a floating-point dtype"),
        ("a", lambda: torch.randn(B, HV, 2 * K)[..., ::2], r"^a: expected a contiguous tensor"),
        ("a", lambda: torch.randn(B, HV, K).to_sparse(), r"^a: expected a dense \(strided\)"),
        ("write_pos", lambda: [0, 1, 2], r"^write_pos: expected a torch\.Tensor, got list"),
    ],
)
def test_a_checked_signature_does_not_let_a_different_one_through(
    argument: str, value: object, mentions: str
) -> None:
    replayssm_decode(**valid_args())  # this signature is now checked and remembered
    args = valid_args()
    args[argument] = value() if callable(value) else value
    if argument == "scale":
        ok = valid_args()
        ok["scale"] = 1
        replayssm_decode(**ok)  # an int scale is fine, and remembered
    with pytest.raises(ValueError, match=mentions):
        replayssm_decode(**args)
