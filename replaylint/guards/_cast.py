"""Policy 'cast': run the call on converted copies, then hand back exactly what the call changed.

For each caller tensor ``original`` and target dtype:

1. *Refuse from metadata* what cannot be copied in and out faithfully: another kind of dtype,
   non-strided layouts, CUDA-graph capture, internal overlap other than expanded (stride-0)
   dimensions.
2. *Copy*: ``base`` is ``original`` with its stride-0 dimensions narrowed to one element (the
   memory it really has); ``converted = base.to(target)``; the function gets ``converted``,
   expanded back to ``original``'s shape where ``original`` was expanded, so it sees the same
   aliasing the caller's tensor has. A bit-level snapshot of ``converted`` is kept.
3. *Refuse from values* a narrowing conversion whose copy would not hold the input (integers out
   of range, finite floats that overflow to infinity). This reads the tensor: one device
   synchronisation, only when the target is narrower than the source.
4. *Copy back by element*: elements whose bits differ from the snapshot are written into
   ``base`` (converted back to the caller's dtype); all others keep their exact original value.
   In eager mode, when no element changed, the caller's tensor is not written at all, so a
   read-only call works on inputs that cannot be written in place (inference tensors outside
   inference mode, tensors autograd saved for backward); finding that out is one device
   synchronisation. The bit comparison also sees writes that bypass autograd's version counter
   (Triton and C++ kernels writing through the data pointer).

While torch.compile traces, the graph cannot branch on data: step 4 is one unconditional masked
write and step 3 runs in a graph break. Meta and fake tensors hold no values: step 3 is skipped
and step 4 is the masked write.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "CastCopy",
    "close_quietly",
    "copy_back",
    "dtype_kind",
    "make_copy",
    "metadata_refusal",
    "narrowing_refusal",
    "narrows",
    "runs_later",
]


@dataclass
class CastCopy:
    """One caller tensor and the copy the function was given."""

    original: torch.Tensor
    base: torch.Tensor
    """``original`` without its stride-0 dimensions: every memory location once."""
    converted: torch.Tensor
    """``base`` converted to the target dtype."""
    given: torch.Tensor
    """What the function receives: ``converted``, expanded like ``original`` if it was."""
    snapshot: torch.Tensor
    """The bits of ``converted`` before the call."""


_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_kind(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating point"
    if dtype == torch.bool:
        return "boolean"
    return "integer"


def metadata_refusal(original: torch.Tensor, want: torch.dtype) -> str | None:
    """Why ``original`` cannot be cast to ``want`` and back, judged from metadata alone."""
    if dtype_kind(original.dtype) != dtype_kind(want):
        return (
            f"it converts only within one kind of dtype (floating point, complex, integer), "
            f"and {original.dtype} is {dtype_kind(original.dtype)}"
        )
    if original.layout != torch.strided:
        return (
            f"it is a {original.layout} tensor, and results can be copied back in place only "
            "into a strided (dense) tensor"
        )
    if (
        not torch.compiler.is_compiling()
        and original.is_cuda
        and torch.cuda.is_current_stream_capturing()
    ):
        return (
            "a CUDA graph is being captured, and the copy and the copy back would be recorded "
            "into the graph and replayed on every step; allocate it as "
            f"{want} before capture"
        )
    # While compiling, sizes may be symbolic and cannot be sorted; an overlapping input then
    # fails in the copy back (copy_ refuses overlapping destinations) instead of here.
    if not torch.compiler.is_compiling() and _may_overlap(_without_broadcast(original)):
        return (
            f"its strides {tuple(original.stride())} make elements overlap in memory other than "
            "by expansion (a stride-0 dimension), so a copy cannot have the same aliasing; "
            "pass a tensor without overlap (e.g. .clone())"
        )
    return None


def make_copy(original: torch.Tensor, target: torch.dtype) -> CastCopy:
    base = _without_broadcast(original)
    converted = base.to(target)
    given = converted if base is original else converted.expand(original.shape)
    with torch.no_grad():
        snapshot = _bits(converted).clone()
    return CastCopy(original, base, converted, given, snapshot)


def narrowing_refusal(source: torch.Tensor, converted: torch.Tensor) -> str | None:
    """Why ``converted`` does not hold the values of ``source`` (reads them; None if it does)."""
    if not narrows(source.dtype, converted.dtype) or source.numel() == 0:
        return None
    if torch.compiler.is_compiling():
        counted = _count_unrepresentable_in_graph_break(source, converted)
    elif _has_values(source):
        counted = _count_unrepresentable(source, converted)
    else:
        return None  # meta and fake tensors: no values to check
    if counted is None:
        return None
    count, example = counted
    return (
        f"{count} of {source.numel()} values are outside the range of {converted.dtype} "
        f"(e.g. {example}), so the {converted.dtype} copy would not hold them"
    )


def copy_back(copies: list[CastCopy]) -> None:
    """Write every element the call changed into the caller's tensors, and nothing else."""
    for copy in copies:
        with torch.no_grad():
            now = _bits(copy.converted)
            if (
                not torch.compiler.is_compiling()
                and _has_values(copy.base)
                and torch.equal(now, copy.snapshot)  # one pass, one synchronisation
            ):
                continue  # nothing to write: the caller's tensor is not touched
            changed = now != copy.snapshot
        back = copy.converted.to(copy.base.dtype)
        copy.base.copy_(torch.where(changed, back, copy.base))


def runs_later(result: object) -> str | None:
    """What kind of object ``result`` is if its code runs only after the call has returned."""
    if inspect.iscoroutine(result):
        return "a coroutine"
    if inspect.isgenerator(result):
        return "a generator"
    if inspect.isasyncgen(result):
        return "an asynchronous generator"
    if inspect.isawaitable(result):
        return f"an awaitable ({type(result).__qualname__})"
    return None


def close_quietly(result: object) -> None:
    """Close a coroutine or generator that will never run (no 'never awaited' warning)."""
    close = getattr(result, "close", None)
    if callable(close) and (inspect.iscoroutine(result) or inspect.isgenerator(result)):
        close()


def _without_broadcast(t: torch.Tensor) -> torch.Tensor:
    base = t
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        if stride == 0 and size > 1:
            base = base.narrow(dim, 0, 1)
    return base


def _may_overlap(t: torch.Tensor) -> bool:
    if t.numel() <= 1:
        return False
    reach = 0  # the largest offset the dimensions seen so far can address
    for stride, size in sorted((abs(s), n) for s, n in zip(t.stride(), t.shape, strict=True)):
        if size == 1:
            continue
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        return t.view(_BIT_VIEWS[t.element_size()])
    return t


def narrows(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether ``target`` cannot hold every finite value of ``source``."""
    if source.is_complex:
        source = source.to_real()
        target = target.to_real()
    if source.is_floating_point:
        return torch.finfo(target).max < torch.finfo(source).max
    return torch.iinfo(target).min > torch.iinfo(source).min or (
        torch.iinfo(target).max < torch.iinfo(source).max
    )


def _count_unrepresentable(base: torch.Tensor, converted: torch.Tensor) -> tuple[int, str] | None:
    with torch.no_grad():
        source, target = base.detach(), converted.detach()
        if source.is_complex():
            source, target = torch.view_as_real(source), torch.view_as_real(target)
        if source.is_floating_point():
            bad = torch.isinf(target) & torch.isfinite(source)
        else:
            bad = target.to(source.dtype) != source
        count = int(bad.sum().item())
        if count == 0:
            return None
        example = source[bad].flatten()[0].item()
    return count, f"{example!r}"


# The check reads values, which a traced graph cannot branch on: under torch.compile it runs in a
# graph break. torch._disable_dynamo imports torch._dynamo only when first called.
_count_unrepresentable_in_graph_break: Callable[
    [torch.Tensor, torch.Tensor], tuple[int, str] | None
] = torch._disable_dynamo(_count_unrepresentable)  # type: ignore[attr-defined]


def _has_values(t: torch.Tensor) -> bool:
    """False for meta and fake tensors, which have shapes and dtypes but no data to read."""
    if t.device.type == "meta":
        return False
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    return fake is None or not fake.is_fake(t)
