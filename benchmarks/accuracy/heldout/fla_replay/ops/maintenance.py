"""In-place ring maintenance between decode steps."""

import torch

from .alloc import new_rings_fp32_gates


def clear_finished_(rings: dict[str, torch.Tensor], finished: torch.Tensor) -> None:
    for ring in rings.values():
        ring[finished] = 0


def select_rings(g_ring: torch.Tensor, donor: torch.Tensor, use_donor: torch.Tensor) -> torch.Tensor:
    g_ring = donor.where(use_donor[:, None, None, None], g_ring)
    return g_ring


def build_clear_and_select() -> dict[str, torch.Tensor]:
    rings = new_rings_fp32_gates(2, 1, 2, 4, 4, torch.bfloat16)
    torch.manual_seed(0)
    rings["g_cache"].uniform_(-1, 0)
    clear_finished_(rings, torch.tensor([False, True]))
    g_ring = select_rings(rings["g_cache"], torch.full_like(rings["g_cache"], -0.5), torch.tensor([True, False]))
    return {"d_cache": rings["d_cache"], "g_ring": g_ring}
