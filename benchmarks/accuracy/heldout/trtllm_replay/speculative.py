"""Eagle-style speculative decoding: replay rows for the accepted draft tokens."""

import torch


def accepted_rows(replayssm_g: torch.Tensor, draft_g: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """accepted: [slots, draft] bool. Rejected tokens contribute no decay."""
    masked = torch.where(accepted[:, None, :, None], draft_g, torch.zeros((), dtype=torch.float32))
    accepted_replayssm_g = masked.cumsum(dim=2) + replayssm_g[:, :, -1:]
    return accepted_replayssm_g


def accepted_rows_no_carry(draft_g: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    accepted_replayssm_g = torch.where(accepted[:, None, :, None], draft_g, 0.0).cumsum(dim=2)  # expect-bug: promotion
    return accepted_replayssm_g


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ring = -torch.rand(3, 2, 4, 4)
    draft = (-torch.rand(3, 2, 3, 4)).bfloat16()
    accepted = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    return ring, draft, accepted


def build_accepted_rows() -> dict[str, torch.Tensor]:
    return {"accepted_replayssm_g": accepted_rows(*_inputs())}


def build_accepted_rows_no_carry() -> dict[str, torch.Tensor]:
    _, draft, accepted = _inputs()
    return {"accepted_replayssm_g": accepted_rows_no_carry(draft, accepted)}
