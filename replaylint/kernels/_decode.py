"""``replayssm_decode``: the public entry of the bundled kernel (validate, then dispatch).

Host cost matters at small batch, where the GPU waits on the CPU. Arguments are checked once
per argument signature (every tensor's shape, strides, dtype and device, and the scalar
arguments): a repeat signature reuses the checked sizes, the chosen launch config and a
recorded launch (see :mod:`replaylint.kernels._launch`), so a repeat call costs a signature
lookup, the data pointers and one launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from replaylint.guards import fp32_gate_cache
from replaylint.kernels._configs import (
    ALL_ROWS,
    CONFIGS,
    Config,
    LaunchConfig,
    launch_config,
    next_power_of_2,
    regime,
)
from replaylint.kernels._launch import (
    LaunchPlan,
    TensorSource,
    launch_and_record,
    pointer_residues,
    tensor_signature,
)
from replaylint.kernels._validate import DecodeArgs, DecodeShapes, ValidDecode, validate_decode_args

__all__ = ["decode_with_cursor_step", "replayssm_decode", "run_decode"]

_INT32_MAX = 2**31 - 1

# The V split and V tile the interpreter uses on CPU: split 1 and the whole of V in one tile
# keep the Python loop short. Tests set other values to run those code paths on CPU.
INTERPRETER_SPLIT = 1
INTERPRETER_BLOCK_V: int | None = None  # None: the whole slice
INTERPRETER_FLUSH = "rows"  # or "dot": the flush's ring term as one matrix product
INTERPRETER_PASSES = 1  # or 2: appending rows and flushing rows in separate launches

# Launch-config override for tuning and benchmarking (regime name -> config); None: CONFIGS.
CONFIG_OVERRIDE: dict[str, Config] | None = None

# Signatures kept at most (a new one past this clears the table).
_MAX_SIGNATURES = 256


# torch.cuda.current_device() without its Python wrapper (the CUDA context exists by now: the
# arguments are CUDA tensors).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _interpreter_requested() -> bool:
    """HELION_INTERPRET=1 sends CUDA tensors through the interpreter too (for debugging)."""
    return os.environ.get("HELION_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


@fp32_gate_cache  # a float32 gate cache by the guard's policy; the checks require a float one
def replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM KDA decode step, in place (sglang-compatible argument order).

    Writes ``out`` for every row; for each row with a valid slot either appends ring row
    ``write_pos[b]`` (d in d_cache's dtype, k once per key head, g as float32) or, at a flush
    (``write_pos[b] == L - 1`` or ``force_flush[b] != 0``), folds the step into
    ``initial_state[slot]``. Rows whose slot is negative (padding) or past the pool get a zero
    output and touch nothing. Cursors are read-only here and clamped into ``[0, L)``; advance
    them with :func:`replaylint.kernels.next_write_pos` or use
    :class:`replaylint.kernels.ReplaySSMCache`.

    CUDA tensors run the compiled Helion kernel with a fixed config; other devices run the same
    kernel body through Helion's interpreter (slow; meant for CPU tests and debugging), as do
    CUDA tensors when the environment variable ``HELION_INTERPRET=1`` is set.
    Returns ``(out, initial_state)``.
    """
    run_decode(
        DecodeArgs(
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            scale,
            initial_state,
            d_cache,
            k_cache,
            g_cache,
            out,
            ssm_state_indices,
            write_pos,
            force_flush,
            use_qk_l2norm_in_kernel,
            lower_bound,
        )
    )
    return out, initial_state


def decode_with_cursor_step(args: DecodeArgs, cursors: torch.Tensor) -> None:
    """A decode step whose cursors live in a per-slot array (``ReplaySSMCache``'s).

    ``args.write_pos`` is the per-row buffer the cursor step fills. Validates everything
    first, then one small launch gathers each row's cursor into it and advances
    ``cursors[slot]`` (0 after a flush, ``c + 1`` otherwise), then the decode kernel runs on
    the gathered cursors. Nothing moves if an argument is wrong.
    """
    prepared = _prepared(args)
    if not prepared.shapes.batch:
        return
    from replaylint.kernels import _kernel

    has_ff = args.force_flush is not None
    flags = args.ssm_state_indices if args.force_flush is None else args.force_flush
    bases = (cursors, args.ssm_state_indices, flags, args.write_pos)  # flags unread without ff
    step_args = (*bases, prepared.shapes.ring_len, has_ff)
    if prepared.interpret:
        _kernel.interpreted_cursor_step()(*step_args)
    else:
        key = (tensor_signature(cursors), has_ff, min(prepared.shapes.batch, 2))
        _launch_planned(
            prepared.cursor_plans,
            key,
            bases,
            lambda: (_kernel.compiled_cursor_step(), step_args, _IDENTITY_SOURCES),
        )
    _launch_decode(prepared, args)


def run_decode(args: DecodeArgs) -> None:
    """Check ``args`` (once per signature) and run the decode kernel on them."""
    prepared = _prepared(args)
    if prepared.shapes.batch:
        _launch_decode(prepared, args)


@dataclass
class _Prepared:
    """What a checked argument signature fixes: sizes, launch config, recorded launches."""

    shapes: DecodeShapes
    interpret: bool
    launch: LaunchConfig
    offsets: torch.dtype  # index dtype of the kernel's offsets
    plans: dict[tuple[Any, ...], LaunchPlan | None] = field(default_factory=dict)
    cursor_plans: dict[tuple[Any, ...], LaunchPlan | None] = field(default_factory=dict)


_PREPARED: dict[tuple[Any, ...], _Prepared] = {}


def _signature(args: DecodeArgs) -> tuple[Any, ...] | None:
    """Everything the checks and the launch config read, or None if some argument is not a
    dense tensor (then the checks run, and report it)."""
    tensors = args[:5] + args[6:13] + ((args.force_flush,) if args.force_flush is not None else ())
    try:
        # Shape, strides, dtype and device: only torch tensors carry these (anything else has
        # no ``stride()`` or compares unequal to every checked signature; a tensor of another
        # layout has no strides either).
        parts = tuple([(t.shape, t.stride(), t.dtype, t.device) for t in tensors])
    except (AttributeError, TypeError, RuntimeError):
        return None
    scale, use_l2, lower_bound = args.scale, args.use_qk_l2norm_in_kernel, args.lower_bound
    # Types too: True == 1 and 1 == 1.0 as keys, but the checks tell them apart.
    return (
        parts,
        type(scale),
        scale,
        type(use_l2),
        use_l2,
        type(lower_bound),
        lower_bound,
        os.environ.get("HELION_INTERPRET"),
        id(CONFIG_OVERRIDE),
        INTERPRETER_SPLIT,
        INTERPRETER_BLOCK_V,
        INTERPRETER_FLUSH,
        INTERPRETER_PASSES,
    )


def _prepared(args: DecodeArgs) -> _Prepared:
    signature = _signature(args)
    prepared = _PREPARED.get(signature) if signature is not None else None
    if prepared is None:
        prepared = _prepare(validate_decode_args(args, reference=False))
        if signature is not None:
            if len(_PREPARED) >= _MAX_SIGNATURES:
                _PREPARED.clear()
            _PREPARED[signature] = prepared
    return prepared


def _prepare(valid: ValidDecode) -> _Prepared:
    args, shapes = valid.args, valid.shapes
    state = args.initial_state
    interpret = state.device.type != "cuda" or _interpreter_requested()
    K, V, L = shapes.head_k_dim, shapes.head_v_dim, shapes.ring_len
    if interpret:
        split = INTERPRETER_SPLIT
        block_v = INTERPRETER_BLOCK_V or next_power_of_2(V // max(split, 1))
        config: Config = {
            "split": split,
            "flush": INTERPRETER_FLUSH,
            "passes": INTERPRETER_PASSES,
            "block_sizes": [block_v],
        }
    else:
        configs = CONFIGS if CONFIG_OVERRIDE is None else CONFIG_OVERRIDE
        config = configs[regime(state.dtype, shapes.batch * shapes.num_value_heads)]
    launch = launch_config(config, K, V, L)
    views = kernel_tensors(valid, launch.split)
    return _Prepared(shapes, interpret, launch, index_dtype(views))


def _span(t: torch.Tensor) -> int:
    """The largest element offset a view reaches from its first element."""
    return sum(
        (int(size) - 1) * abs(int(stride)) for size, stride in zip(t.shape, t.stride(), strict=True)
    )


def index_dtype(tensors: tuple[torch.Tensor, ...]) -> torch.dtype:
    """int32 offsets unless some view reaches more elements than int32 can address (a strided
    pool view can reach far past its own numel: slot stride > slot size)."""
    if any(_span(t) > _INT32_MAX for t in tensors):
        return torch.int64
    return torch.int32


# Kernel tensor i of :func:`kernel_tensors` points into base i of :func:`_bases`, at a byte
# offset fixed by the signature (q, k and v are offsets into mixed_qkv).
_KERNEL_BASES = (0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
_IDENTITY_SOURCES = (
    TensorSource(0, 0),
    TensorSource(1, 0),
    TensorSource(2, 0),
    TensorSource(3, 0),
    None,
    None,
)


def _bases(args: DecodeArgs) -> tuple[torch.Tensor, ...]:
    return (
        args.mixed_qkv,
        args.a,
        args.b,
        args.A_log,
        args.dt_bias,
        args.initial_state,
        args.d_cache,
        args.k_cache,
        args.g_cache,
        args.out,
        args.ssm_state_indices,
        args.write_pos,
        args.write_pos if args.force_flush is None else args.force_flush,
    )


def _launch_decode(prepared: _Prepared, args: DecodeArgs) -> None:
    """Run the decode kernel (compiled on CUDA, interpreted elsewhere)."""
    # Imported here: importing helion takes seconds, and the references do not need it.
    from replaylint.kernels import _kernel

    launch = prepared.launch
    if prepared.interpret:
        valid = ValidDecode(args, prepared.shapes)
        for phase in launch.phases:
            body_args = kernel_arguments(valid, launch, prepared.offsets, phase, interpret=True)
            _kernel.interpreted_kernel(launch.block_v, launch.dot_precision)(*body_args)
        return

    bases = _bases(args)
    for phase in launch.phases:

        def first_launch(
            phase: int = phase,
        ) -> tuple[Any, tuple[Any, ...], tuple[TensorSource | None, ...]]:
            valid = ValidDecode(args, prepared.shapes)
            body_args = kernel_arguments(valid, launch, prepared.offsets, phase, interpret=False)
            base_pointers = [t.data_ptr() for t in bases]
            sources = tuple(
                TensorSource(base, t.data_ptr() - base_pointers[base])
                for base, t in zip(_KERNEL_BASES, body_args[: len(_KERNEL_BASES)], strict=True)
            )
            kernel = _kernel.compiled_kernel(launch.helion, prepared.offsets, launch.dot_precision)
            return kernel, body_args, (*sources, *[None] * (len(body_args) - len(sources)))

        _launch_planned(prepared.plans, (phase,), bases, first_launch)


def _launch_planned(
    plans: dict[tuple[Any, ...], LaunchPlan | None],
    key: tuple[Any, ...],
    bases: tuple[torch.Tensor, ...],
    first_launch: Any,
) -> None:
    """Replay the plan for ``key``, the bases' pointer alignment and the current device, or
    launch through Helion (recording a plan for the next call)."""
    pointers = [t.data_ptr() for t in bases]
    device = _current_device()
    full_key = (*key, device, pointer_residues(pointers))
    plan = plans.get(full_key)
    if plan is not None:
        plan.launch(pointers)
        return
    kernel, body_args, sources = first_launch()
    recorded = launch_and_record(kernel, body_args, sources, device)
    if recorded is not None:
        if len(plans) >= _MAX_SIGNATURES:
            plans.clear()
        plans[full_key] = recorded


def kernel_tensors(valid: ValidDecode, split: int) -> tuple[torch.Tensor, ...]:
    """The kernel body's tensor arguments for validated decode arguments: views, no copies.

    V is split into ``split`` slices of ``V / split`` (splitting one dimension is always a
    view, whatever the pool's strides).
    """
    args, shapes = valid.args, valid.shapes
    B, H, HV = shapes.batch, shapes.num_heads, shapes.num_value_heads
    K, V, L, S = shapes.head_k_dim, shapes.head_v_dim, shapes.ring_len, shapes.slots
    BVs = V // split
    HK = H * K
    # q, k and v as one strided view each of the packed row (its last dim is contiguous).
    mixed_qkv = args.mixed_qkv
    row, start = mixed_qkv.stride(0), mixed_qkv.storage_offset()
    a, dt_bias = args.a, args.dt_bias
    return (
        mixed_qkv.as_strided((B, H, K), (row, K, 1), start),  # q
        mixed_qkv.as_strided((B, H, K), (row, K, 1), start + HK),  # k
        mixed_qkv.as_strided((B, HV, split, BVs), (row, V, BVs, 1), start + 2 * HK),  # v
        a if a.dim() == 3 else a.view(B, HV, K),
        args.b,
        args.A_log,
        dt_bias if dt_bias.dim() == 2 else dt_bias.view(HV, K),
        args.initial_state.view(S, HV, split, BVs, K),
        args.d_cache.view(S, HV, L, split, BVs),
        args.k_cache,
        args.g_cache,
        args.out.view(B, HV, split, BVs),
        args.ssm_state_indices,
        args.write_pos,
        args.write_pos if args.force_flush is None else args.force_flush,  # unread without it
    )


def kernel_arguments(
    valid: ValidDecode,
    launch: LaunchConfig,
    offsets: torch.dtype,
    phase: int = ALL_ROWS,
    *,
    interpret: bool,
) -> tuple[Any, ...]:
    """Every argument of the kernel body, in its order, for one pass (``phase``) of a step."""
    args = valid.args
    lower_bound = args.lower_bound
    return (
        *kernel_tensors(valid, launch.split),
        float(args.scale),
        0.0 if lower_bound is None else float(lower_bound),
        args.use_qk_l2norm_in_kernel,
        lower_bound is not None,
        args.force_flush is not None,
        offsets,
        launch.flush_by_dot,
        phase,
        interpret,
    )
