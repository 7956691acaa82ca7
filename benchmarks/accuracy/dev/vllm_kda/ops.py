"""The decode entry point the layers call; a CPU stand-in that records what it was given."""

from typing import Any, Optional

import torch

LAST_CALL: dict[str, Any] = {}


def fused_recurrent_kda_replayssm_decode(
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
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    LAST_CALL.clear()
    LAST_CALL.update(
        initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, out=out
    )
    out.zero_()
    return out, initial_state
