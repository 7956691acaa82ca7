"""The mamba pool with ReplaySSM rings, and the request-to-token pool that owns it."""

from dataclasses import dataclass
from typing import Optional

import torch

from .configs import KimiLinearCacheParams


class MambaPool:
    @dataclass(frozen=True, kw_only=True)
    class State:
        conv: list[torch.Tensor]
        temporal: torch.Tensor
        replay_d: torch.Tensor
        replay_k: torch.Tensor
        replay_g: torch.Tensor

        def at_layer_idx(self, layer: int) -> "MambaPool.State":
            return type(self)(
                conv=[c[layer] for c in self.conv],
                temporal=self.temporal[layer],
                replay_d=self.replay_d[layer],
                replay_k=self.replay_k[layer],
                replay_g=self.replay_g[layer],
            )

    @dataclass(frozen=True, kw_only=True)
    class SpeculativeState(State):
        intermediate_ssm: torch.Tensor
        intermediate_replay_g: torch.Tensor

    def __init__(
        self,
        size: int,
        cache_params: KimiLinearCacheParams,
        device: str,
        speculative_num_draft_tokens: Optional[int] = None,
        shared_ring_dtype: bool = False,
    ) -> None:
        num_layers = len(cache_params.layers)
        self.size = size
        self.device = device
        conv_dtype, ssm_dtype = cache_params.dtype.conv, cache_params.dtype.temporal
        conv_width = 2 * cache_params.num_heads * cache_params.head_k_dim + (
            cache_params.num_value_heads * cache_params.head_v_dim
        )
        conv_state = [
            torch.zeros(size=(num_layers, size + 1, conv_width, cache_params.conv_kernel_size - 1),
                        dtype=conv_dtype, device=device)
        ]
        temporal_state = torch.zeros(
            size=(num_layers, size + 1) + cache_params.temporal_shape, dtype=ssm_dtype, device=device
        )
        if shared_ring_dtype:
            # One allocation path for all three rings, in the activation dtype.
            replay_d, replay_k, replay_g = [
                torch.zeros(size=(num_layers, size + 1) + shape, dtype=conv_dtype, device=device)  # expect-bug: pool-dtype
                for shape in cache_params.ring_shapes
            ]
        else:
            d_shape, k_shape, g_shape = cache_params.ring_shapes
            ring_dtype = cache_params.ring_dtype
            replay_d = torch.zeros(size=(num_layers, size + 1) + d_shape, dtype=ring_dtype.d, device=device)
            replay_k = torch.zeros(size=(num_layers, size + 1) + k_shape, dtype=ring_dtype.k, device=device)
            replay_g = torch.zeros(size=(num_layers, size + 1) + g_shape, dtype=ring_dtype.g, device=device)  # expect-bug: container id=sgl-legacy; imported-policy id=sgl-args
        if speculative_num_draft_tokens is not None:
            intermediate_ssm = torch.zeros(
                size=(num_layers, size + 1, speculative_num_draft_tokens) + cache_params.temporal_shape,
                dtype=ssm_dtype, device=device,
            )
            intermediate_replay_g = torch.zeros_like(
                replay_d[:, :, None].expand(-1, -1, speculative_num_draft_tokens, -1, -1, -1)
            )  # expect-bug: like
            self.mamba_cache: MambaPool.State = self.SpeculativeState(
                conv=conv_state, temporal=temporal_state, replay_d=replay_d, replay_k=replay_k,
                replay_g=replay_g, intermediate_ssm=intermediate_ssm,
                intermediate_replay_g=intermediate_replay_g,
            )
        else:
            self.mamba_cache = self.State(
                conv=conv_state, temporal=temporal_state, replay_d=replay_d, replay_k=replay_k,
                replay_g=replay_g,
            )
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64, device=device)

    def mamba2_layer_cache(self, layer_id: int) -> "MambaPool.State":
        return self.mamba_cache.at_layer_idx(layer_id)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > len(self.free_slots):
            return None
        select_index, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self.mamba_cache.replay_g[:, select_index] = 0
        return select_index

    def copy_from(self, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
        cache = self.mamba_cache
        for conv in cache.conv:
            conv[:, dst_index] = conv[:, src_index]
        cache.temporal[:, dst_index] = cache.temporal[:, src_index]
        cache.replay_d[:, dst_index] = cache.replay_d[:, src_index]
        cache.replay_k[:, dst_index] = cache.replay_k[:, src_index]
        cache.replay_g[:, dst_index] = cache.replay_g[:, src_index]


def _state(pool: MambaPool) -> dict[str, torch.Tensor]:
    cache = pool.mamba_cache
    tensors = {
        "conv": cache.conv[0],
        "temporal": cache.temporal,
        "replay_d": cache.replay_d,
        "replay_k": cache.replay_k,
        "replay_g": cache.replay_g,
    }
    if isinstance(cache, MambaPool.SpeculativeState):
        tensors["intermediate_replay_g"] = cache.intermediate_replay_g
    return tensors


def build_pool_default() -> dict[str, torch.Tensor]:
    pool = MambaPool(3, KimiLinearCacheParams(), "cpu")
    slots = pool.alloc(2)
    assert slots is not None
    pool.copy_from(slots[:1], slots[1:])
    return _state(pool)


def build_pool_shared_ring_dtype() -> dict[str, torch.Tensor]:
    return _state(MambaPool(3, KimiLinearCacheParams(), "cpu", shared_ring_dtype=True))


def build_pool_speculative() -> dict[str, torch.Tensor]:
    return _state(MambaPool(3, KimiLinearCacheParams(), "cpu", speculative_num_draft_tokens=2))


def build_pool_legacy_params() -> dict[str, torch.Tensor]:
    from .configs import KimiLinearCacheParamsLegacy

    return _state(MambaPool(3, KimiLinearCacheParamsLegacy(), "cpu"))
