"""CPU stand-ins for the custom kernels (the CUDA wheel ships them as ``kda_kernels``)."""

from typing import Any

import torch

LAST_CALL: dict[str, Any] = {}


def kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step; records the state it was given instead of running."""
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    LAST_CALL.update(ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    return out.zero_(), initial_state
