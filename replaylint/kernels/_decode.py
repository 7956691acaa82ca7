"""``replayssm_decode``: the public entry of the bundled kernel (validate, then dispatch).

Host cost matters at small batch, where the GPU waits on the CPU: validation reads metadata
only, the views are a handful, and a launch goes straight to the compiled Triton launcher that
Helion produced on the first call with the same specialisation (see :func:`_launcher`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from replaylint.guards import fp32_gate_cache
from replaylint.kernels._configs import (
    Config,
    ConfigKey,
    config_key,
    fit_split,
    next_power_of_2,
    regime,
    select_config,
)
from replaylint.kernels._validate import DecodeShapes, validate_decode_args

__all__ = ["decode_with_cursor_step", "replayssm_decode"]

_INT32_MAX = 2**31 - 1

# The V split and V tile the interpreter uses on CPU: split 1 and the whole of V in one tile
# keep the Python loop short. Tests set other values to run those code paths on CPU.
INTERPRETER_SPLIT = 1
INTERPRETER_BLOCK_V: int | None = None  # None: the whole slice

# Launch-config override for tuning and benchmarking (regime name -> config); None: _configs.
CONFIG_OVERRIDE: dict[str, Config] | None = None


def _interpreter_requested() -> bool:
    """HELION_INTERPRET=1 sends CUDA tensors through the interpreter too (for debugging)."""
    return os.environ.get("HELION_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def _span(t: torch.Tensor) -> int:
    """The largest element offset a view reaches from its storage's start."""
    span = int(t.storage_offset())
    for size, stride in zip(t.shape, t.stride(), strict=True):
        span += (int(size) - 1) * abs(int(stride))
    return span


def index_dtype(tensors: tuple[torch.Tensor, ...]) -> torch.dtype:
    """int32 offsets unless some view spans more elements than int32 can address.

    A strided pool view can reach far past its own numel (slot stride > slot size). Its
    storage's size bounds every offset and costs one call to read; only views of storages
    past int32 get the exact span from sizes and strides.
    """
    for t in tensors:
        if t.untyped_storage().nbytes() // t.element_size() > _INT32_MAX and _span(t) > _INT32_MAX:
            return torch.int64
    return torch.int32


@fp32_gate_cache  # g_cache must be float32; the checks below leave its dtype to the guard
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
    shapes = validate_decode_args(
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
        reference=False,
    )
    if shapes.batch:
        _launch(
            shapes,
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
    return out, initial_state


@fp32_gate_cache
def decode_with_cursor_step(
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
    cursors: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> None:
    """A decode step whose cursors live in a per-slot array (``ReplaySSMCache``'s).

    Validates everything first, then one small launch gathers each row's cursor into a per-row
    buffer and advances ``cursors[slot]`` (0 after a flush, ``c + 1`` otherwise), then the
    decode kernel runs on the gathered cursors. Nothing moves if an argument is wrong.
    """
    # Filled by the cursor step; a non-tensor index argument is reported by the validation.
    write_pos = (
        torch.empty_like(ssm_state_indices)
        if isinstance(ssm_state_indices, torch.Tensor)
        else ssm_state_indices
    )
    shapes = validate_decode_args(
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
        reference=False,
    )
    if not shapes.batch:
        return
    from replaylint.kernels import _kernel

    has_ff = force_flush is not None
    args = (
        cursors,
        ssm_state_indices,
        force_flush if force_flush is not None else ssm_state_indices,  # unread without it
        write_pos,
        shapes.ring_len,
        has_ff,
    )
    if _interpret(initial_state):
        _kernel.interpreted_cursor_step()(*args)
    else:
        key = ("cursor", has_ff, min(shapes.batch, 2), min(cursors.size(0), 2), shapes.ring_len)
        _launcher(key, _kernel.compiled_cursor_step, args)(*args)
    _launch(
        shapes,
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


def _interpret(initial_state: torch.Tensor) -> bool:
    return initial_state.device.type != "cuda" or _interpreter_requested()


# Compiled launchers by specialisation key (see _launcher).
_LAUNCHERS: dict[tuple[Any, ...], Callable[..., Any]] = {}

# Direct launchers per Triton kernel are dropped (and rebuilt on demand) past this many keys.
_MAX_DIRECT_KEYS = 256


class _DirectLaunch:
    """A ``_launcher`` for Helion's generated host function that reuses Triton's launcher.

    Helion's host function computes the grid and the ~60 launch arguments (tensors first, then
    sizes, strides, scalars and constexprs) and hands them to a launcher, by default Triton's
    ``JITFunction.run``, which re-derives the argument specialisation on every call (measured on
    the H200's host: ~25 us of ~55 us per launch). That specialisation depends only on the
    tensors' 16-byte alignment and the non-tensor arguments' values (== 1, divisibility by 16,
    int32 range), so with exactly those (and the current device) as the key, a repeat launch
    calls the compiled kernel's launcher directly (~18 us); a new key goes through
    ``JITFunction.run`` once (which compiles if it must and returns the compiled kernel).
    """

    def __init__(self) -> None:
        self._runners: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._tensors = -1  # how many leading arguments are tensors (fixed per kernel)

    def __call__(
        self,
        triton_kernel: Any,
        grid: tuple[int, ...],
        *args: Any,
        num_warps: int,
        num_stages: int,
        **kwargs: Any,
    ) -> None:
        n = self._tensors
        if n < 0:
            n = 0
            while n < len(args) and isinstance(args[n], torch.Tensor):
                n += 1
            # The key below holds only for tensors followed by plain values; otherwise every
            # launch takes Triton's own entry.
            plain = all(isinstance(a, (int, float)) for a in args[n:])
            self._tensors = n = n if plain else len(args) + 1
        runner = None
        if n <= len(args):
            # Triton loads a compiled kernel per device and launches on the current one.
            device = torch.cuda.current_device()
            aligned = tuple(t.data_ptr() % 16 == 0 for t in args[:n])
            key = (device, grid, args[n:], aligned)
            runner = self._runners.get(key)
        if runner is not None:
            runner(*args)
            return
        compiled = triton_kernel.run(
            *args,
            grid=grid,
            warmup=False,
            num_warps=num_warps,
            num_stages=num_stages,
            **kwargs,
        )
        if n > len(args) or compiled is None or not hasattr(compiled, "__getitem__"):
            return
        if len(self._runners) >= _MAX_DIRECT_KEYS:
            self._runners.clear()
        self._runners[key] = compiled[(*grid, 1, 1)[:3]]


def _launcher(
    key: tuple[Any, ...], kernel_factory: Callable[[], Any], args: tuple[Any, ...]
) -> Callable[..., Any]:
    """The compiled launcher for ``key``, or Helion's full dispatch the first time.

    ``key`` must fix everything Helion specialises a compile on: the kernel (config, index
    dtype), every tensor's dtype and rank, sizes of 0 / 1 (Helion buckets sizes as 0, 1, many),
    the ``hl.specialize``-d sizes and the constexpr arguments. Helion's own per-call dispatch
    recomputes that key from every argument (tens of microseconds); with the key computed from
    the validated shapes, a repeat call goes straight to the generated host function
    (``BoundKernel._run``), which computes the grid and the launch arguments and hands them to
    :class:`_DirectLaunch`.
    """
    run = _LAUNCHERS.get(key)
    if run is not None:
        return run
    bound = kernel_factory().bind(args)
    bound(*args)  # compiles (the first time) and launches through Helion's checked path
    compiled = getattr(bound, "_run", None)  # Helion 1.5; later versions fall back to `bound`
    if callable(compiled):
        _LAUNCHERS[key] = functools.partial(compiled, _launcher=_DirectLaunch())
    else:
        _LAUNCHERS[key] = bound
    return _noop


def _noop(*args: Any) -> None:
    """The launch already happened inside :func:`_launcher`."""


def _launch(
    shapes: DecodeShapes,
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
    force_flush: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    lower_bound: float | None,
) -> None:
    """Run the decode kernel on validated arguments (compiled on CUDA, interpreted elsewhere)."""
    # Imported here: importing helion takes seconds, and the references do not need it.
    from replaylint.kernels import _kernel

    interpret = _interpret(initial_state)
    pairs = shapes.batch * shapes.num_value_heads
    config: Config = {}
    frozen: ConfigKey = ()
    if interpret:
        split = fit_split(INTERPRETER_SPLIT, shapes.head_v_dim)
        whole = next_power_of_2(shapes.head_v_dim // split)
        config = {"block_sizes": [INTERPRETER_BLOCK_V or whole]}
    elif CONFIG_OVERRIDE is None:
        split, frozen = _shipped_config(
            regime(initial_state.dtype, pairs), initial_state.dtype, pairs, shapes.head_v_dim
        )
    else:
        split, config = select_config(
            initial_state.dtype, pairs, shapes.head_v_dim, CONFIG_OVERRIDE
        )
        frozen = config_key(config)
    tensors = kernel_tensors(
        shapes,
        split,
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        initial_state,
        d_cache,
        k_cache,
        g_cache,
        out,
        ssm_state_indices,
        write_pos,
        force_flush,
    )
    offsets = index_dtype(tensors)
    args = (
        *tensors,
        float(scale),
        0.0 if lower_bound is None else float(lower_bound),
        use_qk_l2norm_in_kernel,
        lower_bound is not None,
        force_flush is not None,
        offsets,
        interpret,
    )
    if interpret:
        _kernel.interpreted_kernel(config["block_sizes"][0])(*args)
        return
    key = (
        "decode",
        frozen,
        offsets,
        split,
        min(shapes.batch, 2),
        min(shapes.slots, 2),
        shapes.num_heads,
        shapes.num_value_heads,
        shapes.head_k_dim,
        shapes.head_v_dim,
        shapes.ring_len,
        mixed_qkv.dtype,
        a.dtype,
        b.dtype,
        dt_bias.dtype,
        initial_state.dtype,
        d_cache.dtype,
        g_cache.dtype,
        out.dtype,
        use_qk_l2norm_in_kernel,
        lower_bound is not None,
        force_flush is not None,
    )
    _launcher(key, lambda: _kernel.compiled_kernel(frozen, offsets), args)(*args)


@functools.lru_cache(maxsize=256)
def _shipped_config(
    regime_name: str, state_dtype: torch.dtype, pairs: int, head_v_dim: int
) -> tuple[int, ConfigKey]:
    """The split and frozen config of a regime (cached: choosing and freezing cost a few
    microseconds per call otherwise)."""
    split, config = select_config(state_dtype, pairs, head_v_dim)
    return split, config_key(config)


def kernel_tensors(
    shapes: DecodeShapes,
    split: int,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """The kernel body's tensor arguments for validated decode arguments: views, no copies.

    V is split into ``split`` slices of ``V / split`` (splitting one dimension is always a
    view, whatever the pool's strides).
    """
    B, H, HV = shapes.batch, shapes.num_heads, shapes.num_value_heads
    K, V, L, S = shapes.head_k_dim, shapes.head_v_dim, shapes.ring_len, shapes.slots
    BVs = V // split
    HK = H * K
    # q, k and v as one strided view each of the packed row (its last dim is contiguous).
    row, start = mixed_qkv.stride(0), mixed_qkv.storage_offset()
    return (
        mixed_qkv.as_strided((B, H, K), (row, K, 1), start),  # q
        mixed_qkv.as_strided((B, H, K), (row, K, 1), start + HK),  # k
        mixed_qkv.as_strided((B, HV, split, BVs), (row, V, BVs, 1), start + 2 * HK),  # v
        a if a.dim() == 3 else a.view(B, HV, K),
        b,
        A_log,
        dt_bias if dt_bias.dim() == 2 else dt_bias.view(HV, K),
        initial_state.view(S, HV, split, BVs, K),
        d_cache.view(S, HV, L, split, BVs),
        k_cache,
        g_cache,
        out.view(B, HV, split, BVs),
        ssm_state_indices,
        write_pos,
        write_pos if force_flush is None else force_flush,  # unread without force_flush
    )
