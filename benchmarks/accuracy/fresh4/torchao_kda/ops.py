# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# Arguments of the last call to each op, by op name (the CPU reference keeps them so
# callers can be checked without the CUDA extension).
_LAST_CALL: Dict[str, Dict[str, Tensor]] = {}


class _ReplaySSMDecode:
    """CPU reference of ``torch.ops.torchao.kda_replayssm_decode``.

    Appends one step to each slot's rings, rebuilds the state from the checkpoint and
    the rings (cumsum of the log-alphas, then exp) and folds full rings into the checkpoint.
    """

    name = "torchao::kda_replayssm_decode"

    def __call__(
        self,
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
    ):
        _LAST_CALL[self.name] = dict(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
        _, H, L, K = k_cache.shape
        HV, V = d_cache.shape[1], d_cache.shape[3]
        B, rep = mixed_qkv.shape[0], HV // H
        q, k, v = mixed_qkv.float().split([H * K, H * K, HV * V], dim=-1)
        q, k, v = q.view(B, H, K), k.view(B, H, K), v.view(B, HV, V)
        if use_qk_l2norm_in_kernel:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        x = a.float().view(B, HV, K) + dt_bias.float().view(HV, K)
        A = A_log.float().exp().view(HV, 1)
        g = -A * F.softplus(x) if lower_bound is None else lower_bound * torch.sigmoid(A * x)
        beta = b.float().sigmoid().view(B, HV, 1)

        slots = ssm_state_indices.long()
        pos = write_pos[slots].long()
        for i in range(B):
            s, p = slots[i], int(pos[i])
            k_cache[s, :, p] = k[i].to(k_cache.dtype)
            g_cache[s, :, p] = g[i].to(g_cache.dtype)
            G = g_cache[s, :, : p + 1].float().cumsum(1)  # [HV, p+1, K]
            keys = k_cache[s, :, : p + 1].float().repeat_interleave(rep, 0)
            decay = (G[:, p : p + 1] - G).exp()  # exp(G_p - G_j)
            S = initial_state[s].float() * G[:, p, None, :].exp()
            S = S + torch.einsum("htv,htk->hvk", d_cache[s, :, :p].float(), keys[:, :p] * decay[:, :p])
            d = beta[i] * (v[i] - torch.einsum("hvk,hk->hv", S, keys[:, p]))
            d_cache[s, :, p] = d.to(d_cache.dtype)
            S = S + d[:, :, None] * keys[:, p, None, :]
            out[i] = (scale * torch.einsum("hvk,hk->hv", S, q[i].repeat_interleave(rep, 0))).reshape(out.shape[1:])
            if p + 1 == L or (force_flush is not None and bool(force_flush[i])):
                initial_state[s] = S.to(initial_state.dtype)
                write_pos[s] = 0
            else:
                write_pos[s] = p + 1
        return out, initial_state


kda_replayssm_decode = _ReplaySSMDecode()


def last_call(op=kda_replayssm_decode) -> Dict[str, Tensor]:
    return dict(_LAST_CALL.get(op.name, {}))
