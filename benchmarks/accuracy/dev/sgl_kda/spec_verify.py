"""EAGLE verify for KDA layers: commit the accepted draft steps' gates to the ring."""

import torch


def verified_gate_rows(accepted_g: torch.Tensor, bonus_g: torch.Tensor) -> torch.Tensor:
    """accepted_g [bs, hv, n, k] from the draft (model dtype); bonus_g [bs, hv, 1, k] from the target."""
    verified_replay_g = torch.cat([accepted_g, bonus_g], dim=2)  # expect-bug: promotion
    return verified_replay_g


def verified_gate_rows_fp32(accepted_g: torch.Tensor, bonus_g: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    verified_replay_g = torch.cat([accepted_g, bonus_g], dim=2) + ring[:, :, -1:]
    return verified_replay_g


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (-torch.rand(2, 2, 2, 4)).bfloat16(), (-torch.rand(2, 2, 1, 4)).bfloat16()


def build_verified_rows() -> dict[str, torch.Tensor]:
    return {"verified_replay_g": verified_gate_rows(*_inputs())}


def build_verified_rows_fp32() -> dict[str, torch.Tensor]:
    return {"verified_replay_g": verified_gate_rows_fp32(*_inputs(), torch.zeros(2, 2, 4, 4))}
