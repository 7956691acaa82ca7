"""The launch fast path: replay a recorded Triton launch with new data pointers.

Host time matters at small batch, where the GPU waits on the CPU. Helion's per-call dispatch
recomputes its specialisation key from every argument, its generated host function reads ~50
sizes and strides to build ~60 launch arguments, and Triton's ``JITFunction.run`` re-derives
its own specialisation: tens of microseconds per call. For a fixed argument signature (every
tensor's shape, strides, dtype and device, the scalar arguments, the pointers' alignment) all
of that is fixed; only the data pointers move. So the first launch of a signature goes through
Helion and Triton once, recording the compiled kernel's launcher and its argument list, and
later launches call that launcher with the new pointers (Triton's launcher takes integers as
pointers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LaunchPlan", "launch_and_record", "pointer_residues", "tensor_signature"]

# Triton specialises pointer arguments on 16-byte alignment.
_ALIGNMENT = 16


def tensor_signature(t: object) -> tuple[Any, ...] | None:
    """What a check of ``t`` reads (shape, strides, dtype, device); None if ``t`` is no dense
    tensor (the full checks then run, and report it)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


def pointer_residues(pointers: Sequence[int]) -> tuple[int, ...]:
    """The pointers modulo the alignment Triton specialises on (with the fixed byte offsets of
    the views, these decide every launched pointer's alignment)."""
    return tuple(p % _ALIGNMENT for p in pointers)


@dataclass(frozen=True)
class TensorSource:
    """Where one launched tensor's pointer comes from: base ``base`` plus ``offset`` bytes."""

    base: int
    offset: int


class LaunchPlan:
    """A recorded launch: the compiled kernel's launcher, its argument list, and which of those
    arguments are pointers into which base tensor."""

    def __init__(
        self,
        runner: Callable[..., Any],
        template: list[Any],
        pointers: list[tuple[int, TensorSource]],
    ) -> None:
        self._runner = runner
        self._template = template
        self._pointers = pointers

    def launch(self, base_pointers: Sequence[int]) -> None:
        """Launch on the current stream with the bases' current data pointers."""
        args = self._template.copy()
        for position, source in self._pointers:
            args[position] = base_pointers[source.base] + source.offset
        self._runner(*args)


class _Recorder:
    """A launcher for Helion's generated host function: launches through Triton's own entry
    (compiling if it must) and keeps what a replay needs."""

    def __init__(self) -> None:
        self.recorded: tuple[Any, tuple[int, ...], tuple[Any, ...]] | None = None

    def __call__(
        self,
        triton_kernel: Any,
        grid: tuple[int, ...],
        *args: Any,
        num_warps: int,
        num_stages: int,
        **kwargs: Any,
    ) -> None:
        compiled = triton_kernel.run(
            *args,
            grid=grid,
            warmup=False,
            num_warps=num_warps,
            num_stages=num_stages,
            **kwargs,
        )
        self.recorded = (compiled, grid, args)


def launch_and_record(
    kernel: Any, kernel_args: tuple[Any, ...], sources: Sequence[TensorSource | None]
) -> LaunchPlan | None:
    """Launch ``kernel`` (a Helion kernel) once on ``kernel_args`` and return a plan that
    repeats that launch, or None when the launch cannot be replayed.

    ``sources[i]`` says where tensor argument ``kernel_args[i]`` points (None for non-tensors).
    The first launch of a specialisation goes through Helion's checked path, which compiles;
    its plan is recorded on the next launch.
    """
    bound = kernel.bind(kernel_args)
    run = getattr(bound, "_run", None)  # Helion 1.5's generated host function, once compiled
    if not callable(run):
        bound(*kernel_args)
        return None
    recorder = _Recorder()
    run(*kernel_args, _launcher=recorder)
    if recorder.recorded is None:
        return None
    compiled, grid, args = recorder.recorded
    if compiled is None or not hasattr(compiled, "__getitem__"):
        return None
    template: list[Any] = list(args)
    pointers: list[tuple[int, TensorSource]] = []
    for position, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            continue
        index = next((i for i, t in enumerate(kernel_args) if t is arg), None)
        source = None if index is None else sources[index]
        if source is None:  # a tensor the host function made: not replayable
            return None
        template[position] = 0
        pointers.append((position, source))
    return LaunchPlan(compiled[(*grid, 1, 1)[:3]], template, pointers)
