"""Speculative verify: the accepted draft steps' gates become ring rows."""

import torch


def accepted_gate_rows(step_gates: list[torch.Tensor]) -> torch.Tensor:
    """step_gates: one [bs, hv, k] tensor per accepted step, in the draft model's dtype."""
    accepted_gate_ring = torch.stack(step_gates, dim=2)  # expect-bug: promotion
    return accepted_gate_ring


def accepted_gate_rows_fp32(step_gates: list[torch.Tensor]) -> torch.Tensor:
    accepted_gate_ring = torch.stack([g.to(torch.float32) for g in step_gates], dim=2)
    return accepted_gate_ring


def _steps() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [(-torch.rand(2, 2, 4)).half() for _ in range(3)]


def build_accepted_rows() -> dict[str, torch.Tensor]:
    return {"accepted_gate_ring": accepted_gate_rows(_steps())}


def build_accepted_rows_fp32() -> dict[str, torch.Tensor]:
    return {"accepted_gate_ring": accepted_gate_rows_fp32(_steps())}
