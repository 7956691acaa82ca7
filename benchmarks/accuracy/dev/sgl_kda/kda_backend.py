"""The KDA attention backend: decode through the pool's per-layer ReplaySSM state."""

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .configs import KimiLinearCacheParams
from .memory_pool import MambaPool

CAPTURED: dict[str, Any] = {}


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
    CAPTURED.clear()
    CAPTURED.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    return out.zero_(), initial_state


@dataclass
class ForwardMetadata:
    cache_indices: torch.Tensor
    write_pos: torch.Tensor
    force_flush: Optional[torch.Tensor] = None


@dataclass
class RadixLinearAttention:
    layer_id: int
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    head_k_dim: int = 4
    num_v_heads: int = 2
    head_v_dim: int = 4
    lower_bound: Optional[float] = None


class KDAAttnBackend:
    def __init__(self, pool: MambaPool) -> None:
        self.req_to_token_pool = pool
        self.forward_metadata: Optional[ForwardMetadata] = None

    def init_forward_metadata(self, cache_indices: torch.Tensor) -> None:
        self.forward_metadata = ForwardMetadata(
            cache_indices=cache_indices.to(torch.int32),
            write_pos=torch.zeros_like(cache_indices, dtype=torch.int32),
        )

    def forward_decode(
        self, layer: RadixLinearAttention, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        assert self.forward_metadata is not None
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, layer.num_v_heads, layer.head_v_dim)
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            scale=layer.head_k_dim**-0.5,
            initial_state=layer_cache.temporal,
            d_cache=layer_cache.replay_d,
            k_cache=layer_cache.replay_k,
            g_cache=layer_cache.replay_g,
            out=out,
            ssm_state_indices=self.forward_metadata.cache_indices,
            write_pos=self.forward_metadata.write_pos,
            force_flush=self.forward_metadata.force_flush,
            use_qk_l2norm_in_kernel=True,
            lower_bound=layer.lower_bound,
        )
        return out

    def forward_decode_low_precision_state(
        self, layer: RadixLinearAttention, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        """The bf16-state variant: the kernel is compiled for one state dtype."""
        assert self.forward_metadata is not None
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        ssm_states = layer_cache.temporal.to(torch.bfloat16)
        out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, layer.num_v_heads, layer.head_v_dim)
        kernel_args = {
            "initial_state": ssm_states,
            "d_cache": layer_cache.replay_d,
            "k_cache": layer_cache.replay_k,
            "g_cache": layer_cache.replay_g.type_as(ssm_states),  # expect-bug: cast
        }
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, layer.A_log, layer.dt_bias, layer.head_k_dim**-0.5,
            out=out,
            ssm_state_indices=self.forward_metadata.cache_indices,
            write_pos=self.forward_metadata.write_pos,
            **kernel_args,
        )
        return out


def _backend() -> tuple[KDAAttnBackend, RadixLinearAttention]:
    pool = MambaPool(3, KimiLinearCacheParams(), "cpu")
    backend = KDAAttnBackend(pool)
    slots = pool.alloc(2)
    assert slots is not None
    backend.init_forward_metadata(slots)
    layer = RadixLinearAttention(layer_id=1, A_log=torch.zeros(2), dt_bias=torch.zeros(2, 4))
    return backend, layer


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (
        torch.randn(2, 16, dtype=torch.bfloat16),
        torch.randn(2, 2, 4, dtype=torch.bfloat16),
        torch.randn(2, 2, dtype=torch.bfloat16),
    )


def build_backend_decode() -> dict[str, Any]:
    backend, layer = _backend()
    backend.forward_decode(layer, *_inputs())
    return dict(CAPTURED)


def build_backend_decode_bf16_state() -> dict[str, Any]:
    backend, layer = _backend()
    backend.forward_decode_low_precision_state(layer, *_inputs())
    return dict(CAPTURED)
