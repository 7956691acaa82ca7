"""Bindings of the KDA decode kernel. On GPU this is ``torch.ops.gpt_fast.kda_replayssm_decode``
from the CUDA extension; the CPU stand-in keeps its signature and records its inputs."""
from typing import Any, Dict, Optional, Tuple

from torch import Tensor

LAST_CALL: Dict[str, Any] = {}


def kda_replayssm_decode(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    scale: float,
    initial_state: Tensor,
    d_cache: Tensor,
    k_cache: Tensor,
    g_cache: Tensor,
    out: Tensor,
    ssm_state_indices: Tensor,
    write_pos: Tensor,
    force_flush: Optional[Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
) -> Tuple[Tensor, Tensor]:
    """One ReplaySSM decode step: appends the step to the rings at ``write_pos`` and replays them
    on top of the checkpoint ``initial_state``; returns ``out`` and the checkpoint."""
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                     ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    return out, initial_state
