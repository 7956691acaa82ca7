"""``replayssm_decode``: the public entry of the bundled kernel (validate, then dispatch)."""

from __future__ import annotations

import os

import torch

from replaylint.guards import fp32_gate_cache
from replaylint.kernels._configs import config_key, interpreter_block_v, select_config
from replaylint.kernels._validate import DecodeShapes, validate_decode_args

__all__ = ["replayssm_decode"]

_INT32_MAX = 2**31 - 1


def _interpreter_requested() -> bool:
    """HELION_INTERPRET=1 sends CUDA tensors through the interpreter too (for debugging)."""
    return os.environ.get("HELION_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def index_dtype(tensors: tuple[torch.Tensor, ...]) -> torch.dtype:
    """int32 offsets unless some view spans more elements than int32 can address.

    A strided pool view can reach far past its own numel (slot stride > slot size), so the
    span is computed from sizes and strides, not from numel.
    """
    for t in tensors:
        span = sum(
            (size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)
        )
        if span + t.storage_offset() > _INT32_MAX:
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
    if shapes.batch == 0:
        return out, initial_state
    tensors, scalars = kernel_arguments(
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
    # Imported here: importing helion takes seconds, and the references do not need it.
    from replaylint.kernels import _kernel

    interpret = initial_state.device.type != "cuda" or _interpreter_requested()
    offsets = index_dtype(tensors)
    if interpret:
        kernel = _kernel.interpreted_kernel(interpreter_block_v(shapes.head_v_dim))
    else:
        programs = shapes.batch * shapes.num_value_heads
        config = select_config(initial_state.dtype, programs, shapes.head_v_dim)
        kernel = _kernel.compiled_kernel(config_key(config), offsets)
    kernel(*tensors, *scalars, offsets, interpret)
    return out, initial_state


KernelScalars = tuple[float, float, bool, bool, bool]


def kernel_arguments(
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
) -> tuple[tuple[torch.Tensor, ...], KernelScalars]:
    """The kernel body's arguments for validated decode arguments: views, no copies."""
    B, H, HV = shapes.batch, shapes.num_heads, shapes.num_value_heads
    K, V = shapes.head_k_dim, shapes.head_v_dim
    tensors = (
        mixed_qkv[:, : H * K].view(B, H, K),  # q
        mixed_qkv[:, H * K : 2 * H * K].view(B, H, K),  # k
        mixed_qkv[:, 2 * H * K :].view(B, HV, V),  # v
        a.view(B, HV, K),
        b,
        A_log,
        dt_bias.view(HV, K),
        initial_state,
        d_cache,
        k_cache,
        g_cache,
        out[:, 0],
        ssm_state_indices,
        write_pos,
        write_pos if force_flush is None else force_flush,  # unread without force_flush
    )
    scalars = (
        float(scale),
        0.0 if lower_bound is None else float(lower_bound),
        use_qk_l2norm_in_kernel,
        lower_bound is not None,
        force_flush is not None,
    )
    return tensors, scalars
