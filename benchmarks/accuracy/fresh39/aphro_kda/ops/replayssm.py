"""Pure-torch reference of the ReplaySSM decode kernel for Kimi Delta Attention.

The Triton build exports the same two entry points; this module is what the CPU backend and the
tests run. Per slot the cache holds a float32 checkpoint ``S [HV, V, K]`` and three rings with
the rows written since that checkpoint:

* ``d_cache [slots, HV, L, V]``: delta-rule updates (model dtype),
* ``k_cache [slots, H, L, K]``: normalised keys (model dtype),
* ``g_cache [slots, HV, L, K]``: per-channel log-decays. They are prefix-summed and exponentiated
  on every step, so this ring is float32.

A decode step replays the slot's ``write_pos`` rows onto its checkpoint, applies the new token,
and appends the token's rows at ``write_pos``; when ``write_pos == L - 1`` the state is folded
into the checkpoint instead. The caller advances ``write_pos`` afterwards.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F


def fused_kda_gate(
    g: torch.Tensor,
    A_log: torch.Tensor,
    head_k_dim: int,
    g_bias: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Log-decays ``[..., HV, K]`` in float32 from the raw gate projection ``g [..., HV*K]``."""
    g = g.float().unflatten(-1, (-1, head_k_dim))
    if g_bias is not None:
        g = g + g_bias.float().view(g.shape[-2:])
    a = A_log.float().exp().unsqueeze(-1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(a * g)
    return -a * F.softplus(g)


def _replay(state: torch.Tensor, d: torch.Tensor, k: torch.Tensor, g: torch.Tensor, n: int, group: int) -> torch.Tensor:
    s = state.float().clone()
    for j in range(n):
        key = k[:, j].float().repeat_interleave(group, dim=0)
        s.mul_(g[:, j].float().exp().unsqueeze(1))
        s.add_(d[:, j].float().unsqueeze(-1) * key.unsqueeze(1))
    return s


def fused_recurrent_kda_replayssm_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    d_cache: Optional[torch.Tensor] = None,
    k_cache: Optional[torch.Tensor] = None,
    g_cache: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    write_pos: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    **unused: object,
) -> torch.Tensor:
    """One token per row. ``q, k [N, 1, H, K]``, ``v [N, 1, HV, V]``, ``g [N, 1, HV, K]`` (log-decays),
    ``beta [N, 1, HV]``; ``ssm_state_indices``/``write_pos`` int32 ``[N]`` (index < 0: padding row).
    Updates the cache in place and returns ``o [N, 1, HV, V]`` in the dtype of ``v``."""
    if initial_state is None or d_cache is None or k_cache is None or g_cache is None:
        raise ValueError("ReplaySSM decode needs initial_state, d_cache, k_cache and g_cache")
    n, _, h, dk = q.shape
    hv, ring_len = d_cache.shape[1], d_cache.shape[2]
    group = hv // h
    scale = dk**-0.5 if scale is None else scale
    qf, kf = q[:, 0].float(), k[:, 0].float()
    if use_qk_l2norm_in_kernel:
        qf, kf = F.normalize(qf, dim=-1), F.normalize(kf, dim=-1)
    indices = torch.arange(n, dtype=torch.int32) if ssm_state_indices is None else ssm_state_indices
    positions = torch.zeros(n, dtype=torch.int32) if write_pos is None else write_pos
    o = torch.zeros(v.shape, dtype=v.dtype)
    for i in range(n):
        slot, pos = int(indices[i]), int(positions[i])
        if slot < 0:
            continue
        s = _replay(initial_state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = kf[i].repeat_interleave(group, dim=0)
        gi = g[i, 0].float()
        s = s * gi.exp().unsqueeze(1)
        delta = beta[i, 0].float().unsqueeze(-1) * (v[i, 0].float() - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        o[i, 0] = torch.einsum("hvk,hk->hv", s, qf[i].repeat_interleave(group, dim=0) * scale).to(v.dtype)
        if pos == ring_len - 1:
            initial_state[slot].copy_(s)
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = kf[i]
            g_cache[slot, :, pos] = gi
    return o


def advance_write_pos(write_pos: torch.Tensor, ring_len: int) -> torch.Tensor:
    return torch.remainder(write_pos + 1, ring_len).to(torch.int32)


def build_reference_decode() -> Dict[str, torch.Tensor]:
    """Five steps of three rows (one padding) on a four-slot cache."""
    torch.manual_seed(0)
    slots, h, hv, dk, dv, ring = 4, 2, 4, 4, 4, 4
    state = torch.zeros(slots, hv, dv, dk, dtype=torch.float32)
    d_cache = torch.zeros(slots, hv, ring, dv, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, h, ring, dk, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, hv, ring, dk, dtype=torch.float32)
    A_log = torch.linspace(-1.0, 0.5, hv)
    indices = torch.tensor([3, -1, 1], dtype=torch.int32)
    pos = torch.zeros(3, dtype=torch.int32)
    outs = []
    for _ in range(5):
        q, k = torch.randn(2, 3, 1, h, dk, dtype=torch.bfloat16).unbind(0)
        v = torch.randn(3, 1, hv, dv, dtype=torch.bfloat16)
        g = fused_kda_gate(torch.randn(3, 1, hv * dk, dtype=torch.bfloat16), A_log, dk)
        beta = torch.rand(3, 1, hv, dtype=torch.bfloat16)
        outs.append(
            fused_recurrent_kda_replayssm_decode(
                q, k, v, g, beta, initial_state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                ssm_state_indices=indices, write_pos=pos, use_qk_l2norm_in_kernel=True,
            )
        )
        pos = advance_write_pos(pos, ring)
    return {"ssm_state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache, "o": torch.stack(outs)}
