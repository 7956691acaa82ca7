"""Preempting and resuming KDA requests: where a float32 gate ring quietly becomes bf16.

A serving engine that preempts a request copies its ReplaySSM rings to host memory and restores
them later; a speculative-decoding draft model gets its own, smaller rings. Each step below is
how such code is commonly written, and each breaks the one rule of ReplaySSM state:

    d_cache, k_cache  follow the model dtype
    g_cache           ALWAYS float32 (the kernel exponentiates prefix sums of its log-decays)

Run ``replaylint examples/`` to see the findings (RL002-RL006) and ``replaylint --diff examples/``
for the fixes; ``replaylint --fix`` on a copy leaves nothing to report.
"""

from __future__ import annotations

import torch
from torch import nn


class DraftRings(nn.Module):
    """Rings for the draft model; built by the model loader under the model's default dtype."""

    def __init__(self, slots: int, heads: int, ring: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        shape = (slots, heads, ring, dim)
        # One loop for the three look-alike rings: the gate ring gets the model dtype too.
        for name in ("d_cache", "k_cache", "g_cache"):
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))


class HostSnapshot:
    """One preempted request's rings, parked in pinned host memory."""

    def __init__(self, rings: dict[str, torch.Tensor], model_dtype: torch.dtype) -> None:
        # "Snapshots are stored in the model dtype to halve host memory."
        self.d_cache = rings["d_cache"].to("cpu", dtype=model_dtype)
        self.k_cache = rings["k_cache"].to("cpu", dtype=model_dtype)
        self.g_cache = rings["g_cache"].to("cpu", dtype=model_dtype)

    def save(self, path: str) -> None:
        torch.save({"d_cache": self.d_cache, "k_cache": self.k_cache, "g_cache": self.g_cache}, path)


def resume(path: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Load a parked request back onto the GPU."""
    state = torch.load(path, map_location=device)
    return {
        "d_cache": state["d_cache"],
        "k_cache": state["k_cache"],
        # Loaded as saved: bf16, whatever the pool expects.
        "g_cache": state["g_cache"],
    }


def fresh_slot_rings(pool: dict[str, torch.Tensor], slot_shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Rings for a newly admitted request, allocated next to the pool's."""
    return {
        "d_cache": pool["d_cache"].new_zeros(slot_shape),
        "k_cache": pool["k_cache"].new_zeros(slot_shape),
        # "Like the delta ring" to match its device -- and, silently, its dtype.
        "g_cache": pool["d_cache"].new_zeros(slot_shape),
    }


class ReplayStatePool(nn.Module):
    """The decode pool; its dtype follows the checkpoint's ``torch_dtype``."""

    def __init__(self, slots: int, heads: int, ring: int, dim: int, torch_dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = torch_dtype
        shape = (slots, heads, ring, dim)
        self.d_cache = torch.zeros(shape, dtype=self.dtype)
        self.k_cache = torch.zeros(shape, dtype=self.dtype)
        self.g_cache = torch.zeros(shape, dtype=self.dtype)
