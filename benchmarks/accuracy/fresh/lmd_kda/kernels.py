"""KDA kernels the layers dispatch to (CPU stand-ins of the Triton kernels)."""

from __future__ import annotations

from typing import Any

LAST_CALL: dict[str, Any] = {}


def fused_kda_replayssm_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    d_cache,
    k_cache,
    g_cache,
    out,
    ssm_state_indices,
    write_pos,
    force_flush=None,
    use_qk_l2norm_in_kernel=False,
    lower_bound=None,
):
    """One KDA decode step on ReplaySSM states: checkpoint states [slots, HV, V, K]; rings
    d_cache [slots, HV, L, V], k_cache [slots, H, L, K], g_cache [slots, HV, L, K]."""
    if ssm_state_indices.shape[0] != mixed_qkv.shape[0]:
        raise ValueError("one slot per sequence")
    LAST_CALL.clear()
    LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    LAST_CALL.update(ssm_state_indices=ssm_state_indices, write_pos=write_pos)
    out.zero_()
    return out, initial_state
