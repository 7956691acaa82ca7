"""Logging and dtype helpers shared by the engines (``deepspeed.utils`` layout)."""

import logging
from collections.abc import Iterable

import torch

logger = logging.getLogger("DeepSpeed")

_STR_TO_DTYPE: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "int32": torch.int32,
}
_DTYPE_TO_STR = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

#: (delta ring, key ring, alpha ring) storage precisions, keyed by the engine's precision.
KDA_RING_PRECISION: dict[str, tuple[str, str, str]] = {
    "fp32": ("fp32", "fp32", "fp32"),
    "bf16": ("bf16", "bf16", "fp32"),
    "fp16": ("fp16", "fp16", "fp16"),  # expect-bug: imported-policy id=ds-ring
}


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = logging.INFO) -> None:
    """Logs ``message`` on the listed ranks only (``-1`` means every rank)."""
    my_rank = 0
    if ranks is None or my_rank in ranks or -1 in ranks:
        logger.log(level, f"[Rank {my_rank}] {message}")


def to_torch_dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if value.lower() not in _STR_TO_DTYPE:
        raise ValueError(f"unsupported dtype string {value!r}")
    return _STR_TO_DTYPE[value.lower()]


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_TO_STR.get(dtype) or str(dtype).removeprefix("torch.")


def kda_ring_dtypes(engine_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """The (delta, key, alpha) ring dtypes the state manager allocates for ``engine_dtype``."""
    precision = _DTYPE_TO_STR.get(engine_dtype)
    if precision not in KDA_RING_PRECISION:
        raise ValueError(f"no ReplaySSM ring layout for engine dtype {engine_dtype}")
    delta, key, alpha = (_STR_TO_DTYPE[name] for name in KDA_RING_PRECISION[precision])
    return delta, key, alpha


def cast_to(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``; the tensor itself when it already has that dtype."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)
