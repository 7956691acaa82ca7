"""The launch fast path: replay a recorded Triton launch with new data pointers.

Host time matters at small batch, where the GPU waits on the CPU. Helion's per-call dispatch
recomputes its specialisation key from every argument, its generated host function reads ~50
sizes and strides to build ~60 launch arguments, and Triton's ``JITFunction.run`` re-derives
its own specialisation: tens of microseconds per call. For a fixed argument signature (every
tensor's shape, strides, dtype and device, the scalar arguments, the pointers' alignment) all
of that is fixed; only the data pointers move. So the first launch of a signature goes through
Helion and Triton once, recording the compiled kernel's launcher and its argument list, and
later launches call that launcher with the new pointers (Triton's launcher takes integers as
pointers). Where Triton's version is one whose launch call is known (3.4 to 3.6), a replay
calls the compiled kernel's native launcher directly, with the function handle and metadata
looked up once: Triton's per-call runner looks up the current device and stream through its
driver and reads several attributes through ``CompiledKernel.__getattribute__``, which is
most of the remaining host time. A launch hook installed in Triton (a profiler) sends every
replay through Triton's own runner, so the hook sees it.
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
    return tuple(map(_ALIGNMENT.__rmod__, pointers))


@dataclass(frozen=True)
class TensorSource:
    """Where one launched tensor's pointer comes from: base ``base`` plus ``offset`` bytes."""

    base: int
    offset: int


# Triton versions whose CompiledKernel runner calls ``run(grid_x, grid_y, grid_z, stream,
# function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``.
_DIRECT_TRITON = ((3, 4), (3, 5), (3, 6))


def _triton_version() -> tuple[int, ...]:
    import triton

    return tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is installed: a callable, or a hook chain (Triton 3.5 on
    keeps one per hook, never None) that holds any."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return not isinstance(calls, list) or bool(calls)


class _DirectRunner:
    """The compiled kernel's native launcher with its fixed arguments bound (see the module
    docstring); Triton's own runner whenever a launch hook is installed."""

    def __init__(self, compiled: Any, grid: tuple[int, ...], device: int) -> None:
        from triton import knobs

        self._fallback = compiled[grid]
        self._knobs = knobs.runtime
        self._native = compiled.run
        self._fixed = (compiled.function, compiled.packed_metadata, None, None, None)
        self._grid = grid
        self._device = device
        self._raw_stream = torch._C._cuda_getCurrentRawStream

    def __call__(self, *args: Any) -> None:
        hooks = self._knobs
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            self._fallback(*args)
            return
        x, y, z = self._grid
        self._native(x, y, z, self._raw_stream(self._device), *self._fixed, *args)


def _runner(compiled: Any, grid: tuple[int, ...], device: int) -> Callable[..., Any]:
    grid3 = (*grid, 1, 1)[:3]
    runner: Callable[..., Any] = compiled[grid3]  # loads the module (Triton's _init_handles)
    if _triton_version() in _DIRECT_TRITON and all(
        hasattr(compiled, name) for name in ("run", "function", "packed_metadata")
    ):
        try:
            return _DirectRunner(compiled, grid3, device)
        except (ImportError, AttributeError):
            pass
    return runner


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
    kernel: Any,
    kernel_args: tuple[Any, ...],
    sources: Sequence[TensorSource | None],
    device: int,
) -> LaunchPlan | None:
    """Launch ``kernel`` (a Helion kernel) once on ``kernel_args`` and return a plan that
    repeats that launch, or None when the launch cannot be replayed.

    ``sources[i]`` says where tensor argument ``kernel_args[i]`` points (None for non-tensors).
    The first launch of a specialisation goes through Helion's checked path, which compiles;
    its plan is recorded on the next launch. ``device`` is the CUDA device index the launch
    runs on (the plan launches on that device's current stream).
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
    return LaunchPlan(_runner(compiled, grid, device), template, pointers)
