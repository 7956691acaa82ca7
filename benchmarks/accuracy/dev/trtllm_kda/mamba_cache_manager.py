"""Slot-based cache manager for KDA layers: checkpoint states plus ReplaySSM rings."""

from typing import NamedTuple

import torch

from ._utils import str_dtype_to_torch
from .kv_cache_config import KvCacheConfig, ReplayCacheDtypes, resolve_replay_dtypes


class ReplayRings(NamedTuple):
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor


class BaseResourceManager:
    def prepare_resources(self, request_ids: list[int]) -> None:
        raise NotImplementedError

    def free_resources(self, request_id: int) -> None:
        raise NotImplementedError


class MambaCacheManager(BaseResourceManager):
    def __init__(
        self,
        num_heads: int,
        num_value_heads: int,
        head_dim: int,
        num_layers: int,
        max_batch_size: int,
        dtypes: ReplayCacheDtypes,
        ring_length: int = 4,
        device: str = "cpu",
    ) -> None:
        self.num_local_layers = num_layers
        self.layer_offsets = {idx: offset for offset, idx in enumerate(range(num_layers))}
        self.mamba_cache_free_blocks = list(range(max_batch_size))
        self.mamba_cache_index: dict[int, int] = {}
        self.ssm_states = torch.empty(
            size=[num_layers, max_batch_size, num_value_heads, head_dim, head_dim],
            dtype=dtypes.ssm,
            device=device,
        )
        self.replay_d_cache = torch.empty(
            size=[num_layers, max_batch_size, num_value_heads, ring_length, head_dim],
            dtype=dtypes.d_ring,
            device=device,
        )
        self.replay_k_cache = torch.empty(
            size=[num_layers, max_batch_size, num_heads, ring_length, head_dim],
            dtype=dtypes.k_ring,
            device=device,
        )
        self.replay_g_cache = torch.empty(
            size=[num_layers, max_batch_size, num_value_heads, ring_length, head_dim],
            dtype=dtypes.g_ring,  # expect-bug: imported-policy id=trt-resolve
            device=device,
        )
        self.write_pos = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        if dtypes.d_ring == torch.float16:
            # fp16 engines run the whole decode path in half precision.
            self.replay_g_cache = self.replay_g_cache.half()  # expect-bug: cast

    def reset(self) -> None:
        for tensor in (self.ssm_states, self.replay_d_cache, self.replay_k_cache, self.replay_g_cache):
            tensor.zero_()

    def prepare_resources(self, request_ids: list[int]) -> None:
        for request_id in request_ids:
            if request_id not in self.mamba_cache_index:
                block = self.mamba_cache_free_blocks.pop()
                self.mamba_cache_index[request_id] = block
                self.replay_g_cache[:, block].zero_()
                self.write_pos[block] = 0

    def free_resources(self, request_id: int) -> None:
        self.mamba_cache_free_blocks.append(self.mamba_cache_index.pop(request_id))

    def get_state_indices(self, request_ids: list[int]) -> torch.Tensor:
        return torch.tensor([self.mamba_cache_index[r] for r in request_ids], dtype=torch.int32)

    def get_ssm_states(self, layer_idx: int) -> torch.Tensor:
        return self.ssm_states[self.layer_offsets[layer_idx]]

    def get_replay_rings(self, layer_idx: int) -> ReplayRings:
        offset = self.layer_offsets[layer_idx]
        return ReplayRings(
            self.replay_d_cache[offset], self.replay_k_cache[offset], self.replay_g_cache[offset]
        )


def create_mamba_cache_manager(
    kv_cache_config: KvCacheConfig, model_dtype: torch.dtype, max_batch_size: int = 3
) -> MambaCacheManager:
    return MambaCacheManager(
        num_heads=1,
        num_value_heads=2,
        head_dim=4,
        num_layers=2,
        max_batch_size=max_batch_size,
        dtypes=resolve_replay_dtypes(kv_cache_config, model_dtype),
        ring_length=kv_cache_config.replay_ring_length,
    )


def create_mamba_cache_manager_fp32_gates(
    kv_cache_config: KvCacheConfig, model_dtype: torch.dtype, max_batch_size: int = 3
) -> MambaCacheManager:
    ring_dtype = (
        model_dtype
        if kv_cache_config.replay_ring_dtype == "auto"
        else str_dtype_to_torch(kv_cache_config.replay_ring_dtype)
    )
    dtypes = ReplayCacheDtypes(ssm=torch.float32, d_ring=ring_dtype, k_ring=ring_dtype, g_ring=torch.float32)
    return MambaCacheManager(1, 2, 4, 2, max_batch_size, dtypes, kv_cache_config.replay_ring_length)


def _rings(manager: MambaCacheManager) -> dict[str, torch.Tensor]:
    manager.reset()
    manager.prepare_resources([7, 9])
    return {
        "ssm_states": manager.ssm_states,
        "replay_d_cache": manager.replay_d_cache,
        "replay_k_cache": manager.replay_k_cache,
        "replay_g_cache": manager.replay_g_cache,
        "write_pos": manager.write_pos,
        "indices": manager.get_state_indices([7, 9]),
    }


def build_manager_auto_bf16() -> dict[str, torch.Tensor]:
    return _rings(create_mamba_cache_manager(KvCacheConfig(), torch.bfloat16))


def build_manager_fp16_engine() -> dict[str, torch.Tensor]:
    return _rings(create_mamba_cache_manager_fp32_gates(KvCacheConfig(), torch.float16))


def build_manager_fp32_gates_bf16_rings() -> dict[str, torch.Tensor]:
    return _rings(create_mamba_cache_manager_fp32_gates(KvCacheConfig(replay_ring_dtype="bfloat16"), torch.float32))
