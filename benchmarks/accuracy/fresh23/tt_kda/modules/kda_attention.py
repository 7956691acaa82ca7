# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Kimi Delta Attention (KDA): gated delta-rule linear attention with per-channel decays."""

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from tt_kda import training
from tt_kda.modules.replay_cache import ReplayRingCache, RingShape
from tt_kda.modules.replayssm import fused_recurrent_kda_replayssm_decode, kda_log_decay
from tt_kda.modules.transformer import RMSNorm
from tt_kda.utils import get_logger

log = get_logger()


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention layer.

    Queries and keys have ``num_heads`` heads, values, decays and write strengths
    ``num_v_heads`` (a multiple of ``num_heads``). Without a cache the layer runs the full
    recurrence from a zero state; with one (see :meth:`setup_cache`) every token goes through
    :func:`fused_recurrent_kda_replayssm_decode`.

    Args:
        embed_dim (int): model dimension.
        num_heads (int): query/key heads ``H``.
        num_v_heads (int): value heads ``HV``.
        head_dim (int): query/key dimension ``K``.
        v_head_dim (int): value dimension ``V``.
        ring_len (int): ring length of the decode cache.
        norm_eps (float): epsilon of the output norm.
        lower_bound (Optional[float]): lower clamp of the log-decays.
    """

    def __init__(
        self,
        *,
        embed_dim: int,
        num_heads: int,
        num_v_heads: int,
        head_dim: int,
        v_head_dim: int,
        ring_len: int = 64,
        norm_eps: float = 1e-5,
        lower_bound: Optional[float] = None,
    ) -> None:
        super().__init__()
        if num_v_heads % num_heads != 0:
            raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of {num_heads=}")
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim
        self.ring_len = ring_len
        self.lower_bound = lower_bound

        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, num_v_heads * v_head_dim, bias=False)
        self.f_proj = nn.Linear(embed_dim, num_v_heads * head_dim, bias=False)
        self.b_proj = nn.Linear(embed_dim, num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(num_v_heads))
        self.dt_bias = nn.Parameter(torch.empty(num_v_heads * head_dim))
        self.o_norm = RMSNorm(v_head_dim, eps=norm_eps)
        self.o_proj = nn.Linear(num_v_heads * v_head_dim, embed_dim, bias=False)

        self.kv_cache: Optional[ReplayRingCache] = None
        self.cache_enabled = False
        self.reset_parameters()

    def reset_parameters(self, dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        """Mamba-style init: ``A`` uniform in [1, 16], ``dt_bias`` the inverse softplus of a
        log-uniform ``dt``."""
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
            log_dt = torch.rand_like(self.dt_bias) * (math.log(dt_max) - math.log(dt_min))
            dt = torch.exp(log_dt + math.log(dt_min)).clamp_min(1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    def ring_shape(self, max_seq_len: Optional[int] = None) -> RingShape:
        """Layout of this layer's decode buffers (the ring is bounded by ``max_seq_len``)."""
        ring_len = self.ring_len if max_seq_len is None else min(self.ring_len, max_seq_len)
        return RingShape(self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim, ring_len)

    def setup_cache(
        self,
        batch_size: int,
        dtype: torch.dtype,
        max_seq_len: int,
        *,
        log_decay_dtype: Optional[torch.dtype] = None,
    ) -> None:
        """Sets up the decode cache.

        Args:
            batch_size (int): number of slots.
            dtype (torch.dtype): dtype of the delta and key rings.
            max_seq_len (int): longest decoded sequence (bounds the ring length).
            log_decay_dtype (Optional[torch.dtype]): dtype of the log-decay ring; defaults to
                the precision policy's choice.
        """
        if self.kv_cache is not None:
            log.warning(
                "Key value caches are already setup. You cannot call ``setup_caches()`` twice. "
                "Skipping."
            )
            return
        if log_decay_dtype is None:
            log_decay_dtype = training.cache_dtype_for("log_decay_cache", dtype)
        self.kv_cache = ReplayRingCache(
            batch_size, self.ring_shape(max_seq_len), dtype, log_decay_dtype=log_decay_dtype
        )
        self.cache_enabled = True

    def reset_cache(self) -> None:
        if self.kv_cache is None:
            raise RuntimeError("Key value caches are not setup. Call ``setup_caches()`` first.")
        self.kv_cache.reset()

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed_qkv, a, b)`` of tokens ``x`` ``[..., embed_dim]``, in the input dtype."""
        mixed_qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        return mixed_qkv, self.f_proj(x), self.b_proj(x)

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """Output projection of the per-head outputs ``[..., HV, V]``."""
        return self.o_proj(self.o_norm(o).flatten(-2))

    def _recurrence(
        self, mixed_qkv: torch.Tensor, b: torch.Tensor, g: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Float32 recurrence from a zero state over ``[B, S, ...]`` inputs.

        Returns:
            the outputs ``[B, S, HV, V]``, the deltas ``[B, S, HV, V]`` and the normalised keys
            ``[B, S, H, K]``.
        """
        bsz, seq_len, _ = mixed_qkv.shape
        hk = self.num_heads * self.head_dim
        group = self.num_v_heads // self.num_heads
        q, k, v = mixed_qkv.float().split([hk, hk, self.num_v_heads * self.v_head_dim], dim=-1)
        q = F.normalize(q.unflatten(-1, (self.num_heads, self.head_dim)), dim=-1)
        k = F.normalize(k.unflatten(-1, (self.num_heads, self.head_dim)), dim=-1)
        v = v.unflatten(-1, (self.num_v_heads, self.v_head_dim))
        beta = torch.sigmoid(b.float())
        state = q.new_zeros(bsz, self.num_v_heads, self.v_head_dim, self.head_dim)
        outputs, deltas = [], []
        for t in range(seq_len):
            keys = k[:, t].repeat_interleave(group, dim=1)
            state = state * g[:, t].exp().unsqueeze(2)
            delta = beta[:, t].unsqueeze(-1) * (
                v[:, t] - torch.einsum("bhvk,bhk->bhv", state, keys)
            )
            state = state + delta.unsqueeze(-1) * keys.unsqueeze(2)
            queries = q[:, t].repeat_interleave(group, dim=1)
            outputs.append(torch.einsum("bhvk,bhk->bhv", state, queries) * self.scale)
            deltas.append(delta)
        return torch.stack(outputs, dim=1), torch.stack(deltas, dim=1), k

    def prompt_rings(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Ring entries of a prompt, laid out like the decode caches (``[B, heads, S, dim]``).

        Used to seed prefix caches from a prompt without running the decode loop.
        """
        mixed_qkv, a, b = self.project(x)
        a = a.unflatten(-1, (self.num_v_heads, self.head_dim))
        dt_bias = self.dt_bias.view(self.num_v_heads, self.head_dim)
        g = -self.A_log.exp().unsqueeze(-1) * F.softplus(a + dt_bias)  # expect-bug: promotion
        if self.lower_bound is not None:
            g = g.clamp_min(self.lower_bound)
        _, deltas, keys = self._recurrence(mixed_qkv, b, g.float())
        return {
            "d_cache": deltas.transpose(1, 2).to(x.dtype),
            "k_cache": keys.transpose(1, 2).to(x.dtype),
            "g_cache": g.transpose(1, 2).contiguous(),
        }

    def forward(self, x: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Outputs ``[B, S, embed_dim]`` for ``x`` ``[B, S, embed_dim]``.

        With a cache, ``x`` continues the sequences held in the cache slots ``0..B-1``.
        """
        bsz, seq_len, _ = x.shape
        mixed_qkv, a, b = self.project(x)
        if self.kv_cache is None or not self.cache_enabled:
            g = kda_log_decay(a, self.A_log, self.dt_bias, self.num_v_heads, self.lower_bound)
            o, _, _ = self._recurrence(mixed_qkv, b, g)
            return self.output(o.to(x.dtype))

        cache = self.kv_cache
        slots = torch.arange(bsz, dtype=torch.int32, device=x.device)
        outputs = []
        for t in range(seq_len):
            step = fused_recurrent_kda_replayssm_decode(
                mixed_qkv[:, t], a[:, t], b[:, t], self.A_log, self.dt_bias, self.scale,
                initial_state=cache.state,
                d_cache=cache.delta_cache,
                k_cache=cache.key_cache,
                g_cache=cache.log_decay_cache,
                ssm_state_indices=slots,
                write_pos=cache.write_pos,
                lower_bound=self.lower_bound,
            )
            outputs.append(step.out)
        return self.output(torch.stack(outputs, dim=1))


def _tiny_layer(dtype: torch.dtype) -> KimiDeltaAttention:
    torch.manual_seed(0)
    with training.set_default_dtype(dtype):
        return KimiDeltaAttention(
            embed_dim=32, num_heads=2, num_v_heads=4, head_dim=8, v_head_dim=8, ring_len=4
        )


def build_decode_layer_bf16() -> Dict[str, object]:
    """A bf16 KDA layer decoding six tokens through its cache (one ring flush)."""
    layer = _tiny_layer(torch.bfloat16)
    layer.setup_cache(batch_size=2, dtype=torch.bfloat16, max_seq_len=32)
    x = torch.randn(2, 6, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    return {"layer": layer, "y": y}


def build_prompt_rings_bf16() -> Dict[str, object]:
    """Prompt rings of a bf16 KDA layer, as used to seed a prefix cache."""
    layer = _tiny_layer(torch.bfloat16)
    x = torch.randn(2, 4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        rings = layer.prompt_rings(x)
    return {"rings": rings}
