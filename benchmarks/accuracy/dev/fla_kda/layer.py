"""fla.layers-style KimiDeltaAttention with a ReplaySSM decode path."""

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cache import Cache
from .ops import fused_recurrent_kda_replayssm_decode, pack_replay_rings
from .ops.fused_recurrent import LAST_RINGS, unpack_replay_rings, unpack_replay_rings_fp32_gates


class KimiDeltaAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int = 16,
        head_dim: int = 4,
        num_heads: int = 1,
        num_v_heads: int = 2,
        replay_ring_len: int = 4,
        layer_idx: int = 0,
        fp32_gate_ring: bool = True,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.replay_ring_len = replay_ring_len
        self.layer_idx = layer_idx
        self.fp32_gate_ring = fp32_gate_ring
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_v_heads * head_dim, bias=False)
        self.f_proj = nn.Linear(hidden_size, num_v_heads * head_dim, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_v_heads, bias=False)

    def init_replay_state(self, batch_size: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape_v = (batch_size, self.num_v_heads, self.replay_ring_len, self.head_dim)
        shape_k = (batch_size, self.num_heads, self.replay_ring_len, self.head_dim)
        d_cache = like.new_zeros(shape_v)
        k_cache = like.new_zeros(shape_k)
        if self.fp32_gate_ring:
            g_cache = like.new_zeros(shape_v, dtype=torch.float32)
        else:
            g_cache = torch.empty_like(d_cache).zero_()  # expect-bug: like
        return d_cache, k_cache, g_cache

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Optional[Cache] = None,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Optional[Cache]]:
        batch, seq_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, seq_len, self.num_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, seq_len, self.num_v_heads, self.head_dim)
        g = F.logsigmoid(self.f_proj(hidden_states)).view(batch, seq_len, self.num_v_heads, self.head_dim)
        beta = self.b_proj(hidden_states).sigmoid()
        last_state = None
        if past_key_values is not None and len(past_key_values) > self.layer_idx:
            last_state = past_key_values[self.layer_idx]
        if last_state is None or last_state["replay_state"] is None:
            replay_state = self.init_replay_state(batch, hidden_states)
            recurrent_state = hidden_states.new_zeros(batch, self.num_v_heads, self.head_dim, self.head_dim)
        else:
            replay_state = last_state["replay_state"]
            recurrent_state = last_state["recurrent_state"]
        d_cache, k_cache, g_cache = replay_state
        o, recurrent_state = fused_recurrent_kda_replayssm_decode(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            initial_state=recurrent_state,
            d_cache=d_cache,
            k_cache=k_cache,
            g_cache=g_cache,
            use_qk_l2norm_in_kernel=True,
        )
        if past_key_values is not None and use_cache:
            past_key_values.update(
                recurrent_state=recurrent_state,
                replay_state=(d_cache, k_cache, g_cache),
                layer_idx=self.layer_idx,
                offset=seq_len,
            )
        return o, past_key_values

    def forward_with_state_kwargs(self, hidden_states: torch.Tensor, **state_kwargs: Any) -> torch.Tensor:
        batch = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(batch, 1, self.num_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, 1, self.num_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, 1, self.num_v_heads, self.head_dim)
        g = F.logsigmoid(self.f_proj(hidden_states)).view(batch, 1, self.num_v_heads, self.head_dim)
        beta = self.b_proj(hidden_states).sigmoid()
        o, _ = fused_recurrent_kda_replayssm_decode(q, k, v, g, beta, **state_kwargs)
        return o


def state_kwargs_for(layer: KimiDeltaAttention, batch: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    like = torch.zeros(0, dtype=dtype)
    d_cache, k_cache, _ = layer.init_replay_state(batch, like)
    return {
        "d_cache": d_cache,
        "k_cache": k_cache,
        "g_cache": torch.zeros(batch, layer.num_v_heads, layer.replay_ring_len, layer.head_dim, dtype=dtype),  # expect-bug: decode-arg
        "initial_state": torch.zeros(batch, layer.num_v_heads, layer.head_dim, layer.head_dim, dtype=dtype),
    }


def _layer(fp32_gate_ring: bool = True) -> KimiDeltaAttention:
    torch.manual_seed(0)
    return KimiDeltaAttention(fp32_gate_ring=fp32_gate_ring).to(torch.bfloat16)


def build_decode_two_steps() -> dict[str, Any]:
    layer, cache = _layer(), Cache()
    x = torch.randn(2, 1, 16, dtype=torch.bfloat16)
    layer(x, past_key_values=cache)
    layer(x, past_key_values=cache)
    return {"states": cache.states, "rings": dict(LAST_RINGS)}


def build_decode_model_dtype_ring() -> dict[str, Any]:
    layer, cache = _layer(fp32_gate_ring=False), Cache()
    layer(torch.randn(2, 1, 16, dtype=torch.bfloat16), past_key_values=cache)
    return {"states": cache.states}


def build_decode_from_state_kwargs() -> dict[str, Any]:
    layer = _layer()
    layer.forward_with_state_kwargs(torch.randn(2, 16, dtype=torch.bfloat16), **state_kwargs_for(layer, 2, torch.bfloat16))
    return dict(LAST_RINGS)


def _rings() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    d = torch.randn(3, 2, 4, 4).to(torch.bfloat16)
    k = torch.randn(3, 1, 4, 4).to(torch.bfloat16)
    g = -torch.rand(3, 2, 4, 4)
    return d, k, g


def build_packed_roundtrip() -> dict[str, torch.Tensor]:
    packed = pack_replay_rings(*_rings())
    d, k, g = unpack_replay_rings_fp32_gates(packed, 1, 2, 4, 4, 4, torch.bfloat16)
    return {"packed": packed, "d_cache": d, "k_cache": k, "g_cache": g}


def build_packed_roundtrip_model_dtype() -> dict[str, torch.Tensor]:
    packed = pack_replay_rings(*_rings())
    d, k, g = unpack_replay_rings(packed, 1, 2, 4, 4, 4, torch.bfloat16)
    return {"d_cache": d, "k_cache": k, "g_cache": g}
