"""PyTorch utilities: random tensors, dtype tables and the replay-cache dtype policy."""

from __future__ import annotations

import contextlib
from typing import Iterator, List, NamedTuple, Optional, Tuple, Union

import torch

from . import logging

logger = logging.get_logger(__name__)

TORCH_DTYPE_BY_NAME = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def maybe_allow_in_graph(cls):
    """Marks a class as safe to trace through with ``torch.compile`` (a no-op without dynamo)."""
    try:
        import torch._dynamo

        return torch._dynamo.allow_in_graph(cls)
    except (ImportError, AttributeError, RuntimeError):
        return cls


def randn_tensor(
    shape: Union[Tuple, List],
    generator: Optional[Union[List[torch.Generator], torch.Generator]] = None,
    device: Optional[Union[str, torch.device]] = None,
    dtype: Optional[torch.dtype] = None,
    layout: Optional[torch.layout] = None,
) -> torch.Tensor:
    """Creates a random tensor on ``device``; with a list of generators each batch row uses its own.

    Sampling happens on the generator's device (CPU generators stay reproducible whatever the
    target device is), and the result is moved afterwards.
    """
    rand_device = device
    batch_size = shape[0]
    layout = layout or torch.strided
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is not None:
        gen_device_type = generator.device.type if not isinstance(generator, list) else generator[0].device.type
        if gen_device_type != device.type and gen_device_type == "cpu":
            rand_device = "cpu"
            if device.type != "mps":
                logger.info("The passed generator was created on 'cpu' even though a tensor on %s was expected.", device)
    if isinstance(generator, list) and len(generator) == 1:
        generator = generator[0]
    if isinstance(generator, list):
        shape = (1,) + tuple(shape[1:])
        rows = [
            torch.randn(shape, generator=generator[i], device=rand_device, dtype=dtype, layout=layout)
            for i in range(batch_size)
        ]
        latents = torch.cat(rows, dim=0).to(device)
    else:
        latents = torch.randn(shape, generator=generator, device=rand_device, dtype=dtype, layout=layout).to(device)
    return latents


@contextlib.contextmanager
def torch_dtype_context(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily makes ``dtype`` torch's default floating dtype (restored on exit)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def resolve_torch_dtype(name: Optional[Union[str, torch.dtype]], default: torch.dtype) -> torch.dtype:
    """``"auto"``/``None`` -> ``default``; a name from ``TORCH_DTYPE_BY_NAME`` or a dtype as is."""
    if name is None or name == "auto":
        return default
    if isinstance(name, torch.dtype):
        return name
    return TORCH_DTYPE_BY_NAME[name]


class ReplayCacheDtypes(NamedTuple):
    """dtypes of one layer's replay caches: the delta ring, the key ring and the stored log-decays."""

    delta: torch.dtype
    key: torch.dtype
    log_decay: torch.dtype = torch.float32


def get_replay_cache_dtypes(torch_dtype: torch.dtype, compact: bool = False) -> ReplayCacheDtypes:
    """The ring dtypes for a model that runs in ``torch_dtype``.

    The delta and key rings are stored in the model dtype. ``compact`` is the memory-saving layout
    used when many slots share one device: every ring in the model dtype.
    """
    if compact:
        return ReplayCacheDtypes(torch_dtype, torch_dtype, torch_dtype)  # expect-bug: imported-policy id=compact-policy
    return ReplayCacheDtypes(delta=torch_dtype, key=torch_dtype)


def slot_index_tensor(num_slots: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """Slot indices as ``int32``, the layout the decode kernel expects for ``ssm_state_indices``."""
    return torch.arange(num_slots, dtype=torch.int32, device=device)
