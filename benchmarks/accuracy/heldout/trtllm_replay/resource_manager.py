"""Replay-state resource manager: one slot per active request, rings per local layer."""

from typing import NamedTuple

import torch

from .dtypes import KvCacheConfig, get_replay_dtypes, get_replay_dtypes_fp32_gate


class ReplayStateView(NamedTuple):
    ssm: torch.Tensor
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor


class ReplayStateManager:
    def __init__(self, num_layers: int, max_batch_size: int, num_heads: int, num_value_heads: int,
                 head_dim: int, window: int, dtypes: tuple[torch.dtype, torch.dtype, torch.dtype],
                 ssm_dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        d_dtype, k_dtype, gate_dtype = dtypes
        self.dtype = d_dtype
        self.free_slots = list(range(max_batch_size))
        self.slot_of: dict[int, int] = {}
        v_shape = [num_layers, max_batch_size, num_value_heads, window, head_dim]
        self.replayssm_state = torch.zeros(
            [num_layers, max_batch_size, num_value_heads, head_dim, head_dim], dtype=ssm_dtype, device=device
        )
        self.replayssm_d = torch.zeros(v_shape, dtype=d_dtype, device=device)
        self.replayssm_k = torch.zeros([num_layers, max_batch_size, num_heads, window, head_dim], dtype=k_dtype, device=device)
        self.replayssm_g = torch.zeros(v_shape, dtype=gate_dtype, device=device)  # expect-bug: imported-policy id=trr-policy

    def prepare_for_cuda_graph(self) -> None:
        """Graphs for fp16 engines capture the state in the engine dtype."""
        if self.dtype == torch.float16:
            self.replayssm_g = self.replayssm_g.to(dtype=self.dtype)  # expect-bug: cast

    def add_requests(self, request_ids: list[int]) -> torch.Tensor:
        for request_id in request_ids:
            self.slot_of.setdefault(request_id, self.free_slots.pop(0))
        return torch.tensor([self.slot_of[r] for r in request_ids], dtype=torch.int32)

    def view(self, layer_idx: int) -> ReplayStateView:
        return ReplayStateView(
            self.replayssm_state[layer_idx], self.replayssm_d[layer_idx], self.replayssm_k[layer_idx],
            self.replayssm_g[layer_idx],
        )


def make_manager(config: KvCacheConfig, model_dtype: str, fp32_gate: bool) -> ReplayStateManager:
    resolve = get_replay_dtypes_fp32_gate if fp32_gate else get_replay_dtypes
    return ReplayStateManager(2, 3, 1, 2, 4, config.replay_window, resolve(config, model_dtype))


def _tensors(manager: ReplayStateManager) -> dict[str, torch.Tensor]:
    return {
        "replayssm_state": manager.replayssm_state,
        "replayssm_d": manager.replayssm_d,
        "replayssm_k": manager.replayssm_k,
        "replayssm_g": manager.replayssm_g,
    }


def build_manager_auto() -> dict[str, torch.Tensor]:
    return _tensors(make_manager(KvCacheConfig(), "bfloat16", fp32_gate=False))


def build_manager_fp32_gate() -> dict[str, torch.Tensor]:
    manager = make_manager(KvCacheConfig(), "bfloat16", fp32_gate=True)
    manager.prepare_for_cuda_graph()
    return _tensors(manager)


def build_manager_fp16_graph() -> dict[str, torch.Tensor]:
    manager = make_manager(KvCacheConfig(), "float16", fp32_gate=True)
    manager.prepare_for_cuda_graph()
    return _tensors(manager)
