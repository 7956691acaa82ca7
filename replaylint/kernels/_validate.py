"""Argument checks for one ReplaySSM decode step, shared by the kernel and the references.

Everything here reads tensor metadata only (shape, dtype, stride, device): no values, so no
device synchronisation. Each violation is a ``ValueError`` that names the argument, what was
expected and what was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_REFERENCE_STATE_DTYPES = (*STATE_DTYPES, torch.float64)
_GATE_DTYPES_REFERENCE = (torch.float32, torch.float64)


@dataclass(frozen=True)
class DecodeShapes:
    """Sizes of one decode step, read off the arguments."""

    batch: int
    num_heads: int  # H: query/key heads
    num_value_heads: int  # HV: value heads (a multiple of H)
    head_k_dim: int  # K
    head_v_dim: int  # V
    ring_len: int  # L
    slots: int  # sequences in the state pool


class DecodeArgs(NamedTuple):
    """The arguments of one ReplaySSM decode step, in the public (sglang) order, unchecked."""

    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float
    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    out: torch.Tensor
    ssm_state_indices: torch.Tensor
    write_pos: torch.Tensor
    force_flush: torch.Tensor | None = None
    use_qk_l2norm_in_kernel: bool = False
    lower_bound: float | None = None


class RecurrentArgs(NamedTuple):
    """The arguments of one plain KDA decode step (a full state per slot), unchecked."""

    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float
    state: torch.Tensor
    out: torch.Tensor
    ssm_state_indices: torch.Tensor
    use_qk_l2norm_in_kernel: bool = False
    lower_bound: float | None = None


class TokenArgs(Protocol):
    """What both steps take per token (the fields :class:`DecodeArgs` and
    :class:`RecurrentArgs` share)."""

    @property
    def mixed_qkv(self) -> torch.Tensor: ...
    @property
    def a(self) -> torch.Tensor: ...
    @property
    def b(self) -> torch.Tensor: ...
    @property
    def A_log(self) -> torch.Tensor: ...
    @property
    def dt_bias(self) -> torch.Tensor: ...
    @property
    def scale(self) -> float: ...
    @property
    def out(self) -> torch.Tensor: ...
    @property
    def ssm_state_indices(self) -> torch.Tensor: ...
    @property
    def use_qk_l2norm_in_kernel(self) -> bool: ...
    @property
    def lower_bound(self) -> float | None: ...


@dataclass(frozen=True)
class ValidDecode:
    """Decode arguments that passed :func:`validate_decode_args`, with their sizes."""

    args: DecodeArgs
    shapes: DecodeShapes


def _fail(name: str, expected: str, got: object, hint: str = "") -> ValueError:
    message = f"{name}: expected {expected}, got {got}"
    if hint:
        message += f". {hint}"
    return ValueError(message)


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _fail(name, "a torch.Tensor", type(value).__name__)
    # A sparse tensor reports zero strides: say what is wrong before any stride check misleads.
    if value.layout != torch.strided:
        raise _fail(
            name, "a dense (strided) tensor", f"a {value.layout} tensor", f"Pass {name}.to_dense()."
        )
    return value


def _rank(name: str, t: torch.Tensor, ranks: tuple[int, ...], layout: str) -> None:
    if t.dim() not in ranks:
        wanted = " or ".join(str(r) for r in ranks)
        raise _fail(name, f"a {wanted}-D tensor {layout}", f"shape {tuple(t.shape)}")


def _shape(name: str, t: torch.Tensor, shape: tuple[int, ...], layout: str) -> None:
    if tuple(t.shape) != shape:
        raise _fail(name, f"shape {shape} {layout}", f"shape {tuple(t.shape)}")


def _floating(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...] | None = None) -> None:
    if allowed is None:
        if not t.dtype.is_floating_point:
            raise _fail(name, "a floating-point dtype", t.dtype)
    elif t.dtype not in allowed:
        raise _fail(name, f"dtype in {_names(allowed)}", t.dtype)


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return "{" + ", ".join(str(d).removeprefix("torch.") for d in dtypes) + "}"


def _int32(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.int32:
        raise _fail(name, "dtype torch.int32", t.dtype, f"Pass {name}.to(torch.int32).")


def _last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.dim() > 0 and t.size(-1) > 1 and t.stride(-1) != 1:
        raise _fail(
            name,
            "a contiguous last dimension (stride 1)",
            f"strides {tuple(t.stride())}",
            "Views into a larger pool are fine as long as the last dimension is dense.",
        )


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise _fail(
            name,
            "a contiguous tensor",
            f"shape {tuple(t.shape)} with strides {tuple(t.stride())}",
            f"Pass {name}.contiguous().",
        )


def _has_data(name: str, device: torch.device) -> None:
    # The other arguments are checked against this device, so one check covers them all.
    if device.type == "meta":
        raise _fail(
            name,
            "a tensor with data (a CPU or CUDA device)",
            "a tensor on the meta device",
            "Meta tensors carry shapes only, and the decode step reads and writes values.",
        )


def _same_device(named: list[tuple[str, torch.Tensor]], device: torch.device) -> None:
    for name, t in named:
        if t.device != device:
            raise _fail(
                name,
                f"a tensor on the state's device ({device})",
                f"a tensor on {t.device}",
                "Move every argument to one device.",
            )


def _check_step_inputs(
    args: TokenArgs,
    *,
    num_heads: int,
    num_value_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    reference: bool,
) -> tuple[int, list[tuple[str, torch.Tensor]]]:
    """Check the per-token inputs shared by the replay step and the plain recurrence.

    Returns the batch size and the checked tensors (for the device check).
    """
    qkv = _tensor("mixed_qkv", args.mixed_qkv)
    _rank("mixed_qkv", qkv, (2,), "[B, 2*H*K + HV*V]")
    batch = qkv.size(0)
    width = 2 * num_heads * head_k_dim + num_value_heads * head_v_dim
    _shape("mixed_qkv", qkv, (batch, width), "[B, 2*H*K + HV*V]")
    _floating("mixed_qkv", qkv)
    _last_dim_contiguous("mixed_qkv", qkv)

    a_t = _tensor("a", args.a)
    _rank("a", a_t, (2, 3), "[B, HV, K] or [B, HV*K]")
    if a_t.dim() == 3:
        _shape("a", a_t, (batch, num_value_heads, head_k_dim), "[B, HV, K]")
    else:
        _shape("a", a_t, (batch, num_value_heads * head_k_dim), "[B, HV*K]")
    _floating("a", a_t)
    _contiguous("a", a_t)

    b_t = _tensor("b", args.b)
    _rank("b", b_t, (2,), "[B, HV]")
    _shape("b", b_t, (batch, num_value_heads), "[B, HV]")
    _floating("b", b_t)

    fp32_params = _GATE_DTYPES_REFERENCE if reference else (torch.float32,)
    a_log = _tensor("A_log", args.A_log)
    _rank("A_log", a_log, (1,), "[HV]")
    _shape("A_log", a_log, (num_value_heads,), "[HV]")
    _floating("A_log", a_log, fp32_params)

    bias = _tensor("dt_bias", args.dt_bias)
    _rank("dt_bias", bias, (1, 2), "[HV, K] or [HV*K]")
    if bias.dim() == 2:
        _shape("dt_bias", bias, (num_value_heads, head_k_dim), "[HV, K]")
    else:
        _shape("dt_bias", bias, (num_value_heads * head_k_dim,), "[HV*K]")
    _floating("dt_bias", bias, fp32_params)
    _contiguous("dt_bias", bias)

    scale = args.scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise _fail("scale", "a Python float (usually K ** -0.5)", type(scale).__name__)
    if not math.isfinite(scale):
        raise _fail("scale", "a finite float", scale)

    o = _tensor("out", args.out)
    _rank("out", o, (4,), "[B, 1, HV, V]")
    _shape("out", o, (batch, 1, num_value_heads, head_v_dim), "[B, 1, HV, V]")
    _floating("out", o)
    _contiguous("out", o)

    idx = _tensor("ssm_state_indices", args.ssm_state_indices)
    _rank("ssm_state_indices", idx, (1,), "[B]")
    _shape("ssm_state_indices", idx, (batch,), "[B]")
    _int32("ssm_state_indices", idx)

    use_l2 = args.use_qk_l2norm_in_kernel
    if not isinstance(use_l2, bool):
        raise _fail("use_qk_l2norm_in_kernel", "a bool", type(use_l2).__name__)
    lower_bound = args.lower_bound
    if lower_bound is not None:
        if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)):
            raise _fail("lower_bound", "None or a negative float", type(lower_bound).__name__)
        if not (math.isfinite(lower_bound) and lower_bound < 0):
            raise _fail(
                "lower_bound",
                "None or a finite negative float (the bounded gate is lb * sigmoid(A * x))",
                lower_bound,
            )
    named = [
        ("mixed_qkv", qkv),
        ("a", a_t),
        ("b", b_t),
        ("A_log", a_log),
        ("dt_bias", bias),
        ("out", o),
        ("ssm_state_indices", idx),
    ]
    return batch, named


def _no_internal_overlap(name: str, t: torch.Tensor) -> None:
    """Reject a view in which two indices address one element (an expanded or zero-stride
    pool view): a write for one slot would land in others. Metadata only; conservative for
    exotic interleaved strides, exact for every layout a pool view takes."""
    dims = sorted(
        (abs(int(st)), int(n)) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1
    )
    reach = 0  # the largest offset the smaller-stride dims reach
    for stride, size in dims:
        if stride <= reach:
            raise _fail(
                name,
                "a view whose elements do not overlap (no zero or expanded strides)",
                f"shape {tuple(t.shape)} with strides {tuple(t.stride())}",
                "Every slot needs its own memory: pass a real pool, not an expanded view.",
            )
        reach += (size - 1) * stride


def validate_decode_args(args: DecodeArgs, *, reference: bool) -> ValidDecode:
    """Check every argument of a ReplaySSM decode step; return them with their sizes.

    ``reference=True`` is the plain-PyTorch oracle's contract: float64 is allowed anywhere and
    the gate cache must be float32 or float64. ``reference=False`` is the kernel's contract:
    state fp32/bf16/fp16, A_log/dt_bias fp32, a floating-point gate cache (the
    ``replaylint.guards.fp32_gate_cache`` guard on the public entry decides, by its policy,
    what a gate cache other than float32 does).
    """
    state = _tensor("initial_state", args.initial_state)
    _rank("initial_state", state, (4,), "[slots, HV, V, K]")
    slots, num_value_heads, head_v_dim, head_k_dim = state.shape
    _floating("initial_state", state, _REFERENCE_STATE_DTYPES if reference else STATE_DTYPES)
    _last_dim_contiguous("initial_state", state)
    device = state.device
    _has_data("initial_state", device)

    d = _tensor("d_cache", args.d_cache)
    _rank("d_cache", d, (4,), "[slots, HV, L, V]")
    ring_len = d.size(2)
    if ring_len < 1:
        raise _fail("d_cache", "a ring length L = d_cache.shape[2] >= 1", ring_len)
    _shape("d_cache", d, (slots, num_value_heads, ring_len, head_v_dim), "[slots, HV, L, V]")
    _floating("d_cache", d)
    _last_dim_contiguous("d_cache", d)

    k = _tensor("k_cache", args.k_cache)
    _rank("k_cache", k, (4,), "[slots, H, L, K]")
    num_heads = k.size(1)
    if num_heads < 1 or num_value_heads % num_heads != 0:
        raise _fail(
            "k_cache",
            f"a key-head count H = k_cache.shape[1] that divides HV = {num_value_heads}",
            f"H = {num_heads}",
        )
    _shape("k_cache", k, (slots, num_heads, ring_len, head_k_dim), "[slots, H, L, K]")
    if k.dtype != d.dtype:
        raise _fail(
            "k_cache",
            f"the same dtype as d_cache ({d.dtype})",
            k.dtype,
            "The d and k rings follow one model dtype.",
        )
    _last_dim_contiguous("k_cache", k)

    g = _tensor("g_cache", args.g_cache)
    _rank("g_cache", g, (4,), "[slots, HV, L, K]")
    _shape("g_cache", g, (slots, num_value_heads, ring_len, head_k_dim), "[slots, HV, L, K]")
    _floating("g_cache", g, _GATE_DTYPES_REFERENCE if reference else None)
    _last_dim_contiguous("g_cache", g)
    for name, pool in (("initial_state", state), ("d_cache", d), ("k_cache", k), ("g_cache", g)):
        _no_internal_overlap(name, pool)

    batch, named = _check_step_inputs(
        args,
        num_heads=num_heads,
        num_value_heads=num_value_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        reference=reference,
    )
    pos = _tensor("write_pos", args.write_pos)
    _rank("write_pos", pos, (1,), "[B]")
    _shape("write_pos", pos, (batch,), "[B]")
    _int32("write_pos", pos)
    named += [("d_cache", d), ("k_cache", k), ("g_cache", g), ("write_pos", pos)]
    if args.force_flush is not None:
        ff = _tensor("force_flush", args.force_flush)
        _rank("force_flush", ff, (1,), "[B]")
        _shape("force_flush", ff, (batch,), "[B]")
        _int32("force_flush", ff)
        named.append(("force_flush", ff))
    _same_device(named, device)
    shapes = DecodeShapes(
        batch=batch,
        num_heads=num_heads,
        num_value_heads=num_value_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        ring_len=ring_len,
        slots=slots,
    )
    return ValidDecode(args, shapes)


def validate_recurrent_args(args: RecurrentArgs) -> DecodeShapes:
    """Check the arguments of the plain recurrence (a full state per slot, no ring).

    H is read off mixed_qkv's width, 2*H*K + HV*V.
    """
    s = _tensor("state", args.state)
    _rank("state", s, (4,), "[slots, HV, V, K]")
    slots, num_value_heads, head_v_dim, head_k_dim = s.shape
    _floating("state", s, _REFERENCE_STATE_DTYPES)
    _has_data("state", s.device)
    qkv = _tensor("mixed_qkv", args.mixed_qkv)
    _rank("mixed_qkv", qkv, (2,), "[B, 2*H*K + HV*V]")
    key_width = qkv.size(1) - num_value_heads * head_v_dim
    num_heads = key_width // (2 * head_k_dim) if head_k_dim > 0 else 0
    if num_heads < 1 or key_width != 2 * num_heads * head_k_dim or num_value_heads % num_heads != 0:
        raise _fail(
            "mixed_qkv",
            f"width 2*H*K + HV*V with K = {head_k_dim}, V = {head_v_dim}, HV = {num_value_heads}"
            " and H dividing HV",
            f"width {qkv.size(1)}",
        )
    batch, named = _check_step_inputs(
        args,
        num_heads=num_heads,
        num_value_heads=num_value_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        reference=True,
    )
    _same_device(named, s.device)
    return DecodeShapes(
        batch=batch,
        num_heads=num_heads,
        num_value_heads=num_value_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        ring_len=0,
        slots=slots,
    )
