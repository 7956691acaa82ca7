"""Bindings of the ReplaySSM decode kernel.

On GPU ``replay_kda_decode`` is ``torch.ops.gptfast_kda.replay_decode`` from the extension; this
CPU stand-in keeps the signature and records what it was given, so that the decode path of the
model runs anywhere."""

from typing import Any, Dict, Optional, Tuple

from torch import Tensor

LAST_CALL: Dict[str, Any] = {}


def replay_kda_decode(
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
    """One ReplaySSM step of Kimi Delta Attention; returns ``out`` and the state."""
    LAST_CALL.clear()
    LAST_CALL.update(
        initial_state=initial_state,
        d_cache=d_cache,
        k_cache=k_cache,
        g_cache=g_cache,
        ssm_state_indices=ssm_state_indices,
        write_pos=write_pos,
    )
    return out, initial_state
