"""Binding of the ReplaySSM decode kernel of Kimi Delta Attention.

On GPU this is ``mistral_kda_ops.fused_recurrent_kda_replayssm_decode`` from the compiled
extension; the CPU stand-in here keeps the signature and records its inputs."""
from typing import Any, Dict, Optional, Tuple

import torch

LAST_CALL: Dict[str, Any] = {}


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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decode step for every sequence of the batch; returns ``out`` and the state."""
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                     ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    return out, initial_state
