"""Binding of ``fused_recurrent_kda_replayssm_decode`` (the sglang / fla kernel). The CUDA kernel is
not available everywhere: this stand-in keeps its signature and records its arguments."""
from typing import Any, Dict, Optional, Tuple

import torch

LAST_CALL: Dict[str, Any] = {}


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None, use_qk_l2norm_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                     ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    return out, initial_state
