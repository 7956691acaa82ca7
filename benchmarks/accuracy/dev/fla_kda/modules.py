"""Layer-state helpers in the fla.modules style."""

import torch

from .state import ReplayRingSpecFp32, allocate_replay_rings


def reset_rings_(rings: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Zeroes the rings of finished sequences in place (mask: [batch] bool)."""
    for ring in rings.values():
        ring.masked_fill_(mask[:, None, None, None], 0)
    return rings


def merge_gate_rings(g_cache: torch.Tensor, other: torch.Tensor, take_other: torch.Tensor) -> torch.Tensor:
    g_cache = torch.where(take_other[:, None, None, None], other, g_cache)
    return g_cache


def build_reset_and_merge() -> dict[str, torch.Tensor]:
    rings = allocate_replay_rings(ReplayRingSpecFp32(), 2)
    torch.manual_seed(0)
    rings["g_cache"].uniform_(-1, 0)
    reset_rings_(rings, torch.tensor([True, False]))
    merged = merge_gate_rings(rings["g_cache"], torch.zeros_like(rings["g_cache"]), torch.tensor([False, True]))
    return {"d_cache": rings["d_cache"], "g_cache": merged}
