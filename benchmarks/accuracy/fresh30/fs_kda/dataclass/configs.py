"""Precision policy of the KDA decode caches (``fairseq/dataclass/configs.py`` in spirit).

Two kinds of decode cache exist:

* incremental buffers (``incremental_state`` entries of each ``KimiDeltaAttention``), one per
  sequence of a batch, used by ``SequenceGenerator``, the hub and ``interactive``;
* the slot pool of streaming decoders (``--max-slots``), a fixed set of slots shared by the
  requests of ``serve``.

The checkpoint of the recurrence is always float32; the delta/key rings follow the precision
flags; the log-decay ring is summed and exponentiated by the kernel.
"""

import argparse
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from fs_kda import utils

# --fp16/--bf16/--memory-efficient-* -> storage of the rings (see ``ring_precision``).
RING_PRECISION: Dict[str, Dict[str, str]] = {
    "fp32": {"ring": "float32", "log_decay": "float32"},
    "fp16": {"ring": "float16", "log_decay": "float32"},
    "bf16": {"ring": "bfloat16", "log_decay": "float32"},
    "memory_efficient_fp16": {"ring": "float16", "log_decay": "float16"},  # expect-bug: imported-policy id=mem-eff-policy
    "memory_efficient_bf16": {"ring": "bfloat16", "log_decay": "float32"},
}


def ring_precision(args: argparse.Namespace) -> str:
    """The ``RING_PRECISION`` entry selected by the precision flags of ``args``."""
    if getattr(args, "memory_efficient_bf16", False):
        return "memory_efficient_bf16"
    if getattr(args, "memory_efficient_fp16", False):
        return "memory_efficient_fp16"
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


@dataclass
class IncrementalStateConfig:
    """dtypes of one layer's incremental buffers.

    ``ring_dtype`` None means "the dtype of the activations" (resolved when a buffer is first
    created); log-decays lie in (-inf, 0], which bfloat16 covers with float32's exponent range.
    """

    state_dtype: torch.dtype = torch.float32
    ring_dtype: Optional[torch.dtype] = None
    log_decay_dtype: torch.dtype = torch.bfloat16  # expect-bug: container

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "IncrementalStateConfig":
        policy = RING_PRECISION[ring_precision(args)]
        ring = getattr(args, "cache_dtype", None) or policy["ring"]
        log_decay = getattr(args, "log_decay_cache_dtype", None) or policy["log_decay"]
        return cls(ring_dtype=utils.str_to_dtype(ring), log_decay_dtype=utils.str_to_dtype(log_decay))  # expect-bug: imported-policy id=mem-eff-policy; imported-policy id=edge-arch

    @classmethod
    def for_model_dtype(cls, dtype: torch.dtype) -> "IncrementalStateConfig":
        return cls(ring_dtype=dtype, log_decay_dtype=torch.float32)


@dataclass
class SlotPoolConfig:
    """Shape and storage of a ``SlotStatePool``."""

    max_slots: int
    ring_len: int = 4
    ring_dtype: torch.dtype = torch.float32

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SlotPoolConfig":
        ring = getattr(args, "slot_ring_dtype", None) or RING_PRECISION[ring_precision(args)]["ring"]
        return cls(max_slots=args.max_slots, ring_len=args.ring_len, ring_dtype=utils.str_to_dtype(ring))
