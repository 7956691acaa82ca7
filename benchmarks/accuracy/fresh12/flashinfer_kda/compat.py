"""Stand-ins for the pieces of the CUDA build (custom-op registration, PDL, NVTX) on CPU."""

import contextlib
import functools
from typing import Callable, Optional, Sequence

import torch

_registered_ops = {}


def register_custom_op(
    name: str,
    mutates_args: Sequence[str] = (),
    device_types: Optional[Sequence[str]] = None,
) -> Callable[[Callable], Callable]:
    """Records ``fn`` under ``flashinfer_kda::<name>``; the CPU build calls it directly."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def op(*args, **kwargs):
            return fn(*args, **kwargs)

        op.op_name = f"flashinfer_kda::{name}"
        op.mutates_args = tuple(mutates_args)
        _registered_ops[op.op_name] = op
        return op

    return wrap


def register_fake_op(name: str) -> Callable[[Callable], Callable]:
    """Fake (meta) implementations are not needed without torch.compile; returns ``fn``."""

    def wrap(fn: Callable) -> Callable:
        return fn

    return wrap


def device_support_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch needs sm90; never on CPU."""
    return False


def is_cuda_graph_capturing() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


@contextlib.contextmanager
def nvtx_range(message: str):
    """No-op NVTX range."""
    yield
