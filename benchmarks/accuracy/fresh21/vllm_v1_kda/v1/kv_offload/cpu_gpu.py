"""Offloading of KV caches to CPU memory (vllm/v1/kv_offload/worker/cpu_gpu.py).

Attention blocks and KDA replay slots are copied block by block between the device caches
and pinned host mirrors of the same layout.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Union

import torch
from torch import nn

from vllm_v1_kda.config import VllmConfig, tiny_vllm_config
from vllm_v1_kda.utils import STR_DTYPE_TO_TORCH_DTYPE, get_dtype_size, is_pin_memory_available
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayState
from vllm_v1_kda.v1.kv_cache_interface import KVCacheSpec, MambaSpec

logger = logging.getLogger(__name__)


class HostReplayCache(nn.Module):
    """Host mirror of one KDA layer's pool, as buffers, so that the four tensors move, pin
    and serialise together."""

    def __init__(self, gpu_cache: KDAReplayState, num_cpu_blocks: int, pin_memory: bool) -> None:
        super().__init__()
        for name, tensor in gpu_cache._asdict().items():
            self.register_buffer(
                name,
                torch.zeros(
                    (num_cpu_blocks, *tensor.shape[1:]), dtype=tensor.dtype, device="cpu", pin_memory=pin_memory
                ),
            )

    def as_state(self) -> KDAReplayState:
        return KDAReplayState(self.state, self.d_cache, self.k_cache, self.g_cache)


class CpuGpuOffloadingHandler:
    def __init__(self, gpu_caches: dict[str, Any], num_cpu_blocks: int, vllm_config: VllmConfig) -> None:
        self.pin_memory = is_pin_memory_available()
        self.device = vllm_config.device_config.device
        self.dtype = vllm_config.model_config.dtype
        kv_transfer_config = vllm_config.kv_transfer_config
        self.gpu_caches = gpu_caches
        self.cpu_caches: dict[str, Union[torch.Tensor, HostReplayCache]] = {}
        for layer_name, gpu_cache in gpu_caches.items():
            if isinstance(gpu_cache, KDAReplayState):
                host = HostReplayCache(gpu_cache, num_cpu_blocks, self.pin_memory)
                if kv_transfer_config is not None and kv_transfer_config.kv_buffer_dtype != "auto":
                    # the host mirror may be kept in a smaller dtype than the device cache
                    host_dtype = STR_DTYPE_TO_TORCH_DTYPE[kv_transfer_config.kv_buffer_dtype]
                    host = host.to(dtype=host_dtype)  # expect-bug: module-cast
                self.cpu_caches[layer_name] = host
            else:
                # [2, num_blocks, block_size, num_kv_heads, head_size]
                self.cpu_caches[layer_name] = torch.zeros(
                    (gpu_cache.shape[0], num_cpu_blocks, *gpu_cache.shape[2:]),
                    dtype=gpu_cache.dtype,
                    device="cpu",
                    pin_memory=self.pin_memory,
                )

    def _pairs(self, layer_name: str) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """(device tensor, host tensor, block dim) of one layer."""
        gpu, cpu = self.gpu_caches[layer_name], self.cpu_caches[layer_name]
        if isinstance(cpu, HostReplayCache):
            return [(g, c, 0) for g, c in zip(gpu, cpu.as_state())]
        return [(gpu, cpu, 1)]

    def swap_out(self, src_blocks: list[int], dst_cpu_blocks: list[int]) -> None:
        """Device blocks -> host blocks, every layer."""
        src = torch.tensor(src_blocks, dtype=torch.long, device=self.device)
        dst = torch.tensor(dst_cpu_blocks, dtype=torch.long)
        for layer_name in self.gpu_caches:
            for gpu, cpu, dim in self._pairs(layer_name):
                cpu.index_copy_(dim, dst, gpu.index_select(dim, src).to("cpu", non_blocking=self.pin_memory))

    def swap_in(self, src_cpu_blocks: list[int], dst_blocks: list[int]) -> None:
        """Host blocks -> device blocks, every layer."""
        src = torch.tensor(src_cpu_blocks, dtype=torch.long)
        dst = torch.tensor(dst_blocks, dtype=torch.long, device=self.device)
        for layer_name in self.gpu_caches:
            for gpu, cpu, dim in self._pairs(layer_name):
                gpu.index_copy_(dim, dst, cpu.index_select(dim, src).to(self.device, non_blocking=self.pin_memory))

    def load_replay_rows(self, cpu_blocks: list[int]) -> dict[str, KDAReplayState]:
        """Host slots as device tensors of their own, for a batch that decodes from a gathered
        pool (prefix-cache hits of recurrent layers are not swapped back into the pool)."""
        index = torch.tensor(cpu_blocks, dtype=torch.long)
        rows: dict[str, KDAReplayState] = {}
        for layer_name, host in self.cpu_caches.items():
            if not isinstance(host, HostReplayCache):
                continue
            rows[layer_name] = KDAReplayState(  # expect-bug: load
                *(t.index_select(0, index).to(self.device, dtype=self.dtype, non_blocking=self.pin_memory) for t in host.as_state())
            )
        return rows


def allocate_transfer_buffers(
    kv_cache_specs: dict[str, KVCacheSpec], num_blocks: int, pin_memory: bool
) -> dict[str, Any]:
    """One contiguous host buffer per layer for the connector's transfers, viewed as the
    layer's caches (block-major per state)."""
    buffers: dict[str, Any] = {}
    for layer_name, spec in kv_cache_specs.items():
        raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.uint8, device="cpu", pin_memory=pin_memory)
        if isinstance(spec, MambaSpec):
            views = []
            offset = 0
            for shape in spec.shapes:
                view = raw[offset:].view(spec.dtype)[: num_blocks * math.prod(shape)].view(num_blocks, *shape)  # expect-bug: pool-dtype
                views.append(view)
                offset += view.numel() * view.element_size()
            buffers[layer_name] = KDAReplayState(*views)
        else:
            buffers[layer_name] = raw.view(spec.dtype).view(2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    return buffers


def _runner(vllm_config: VllmConfig):
    from vllm_v1_kda.v1.worker.gpu_model_runner import _decode, _new_runner

    runner = _new_runner(vllm_config)
    _decode(runner, num_steps=3)
    return runner


def build_offload_host_mirror():
    """Swap two slots out to the host mirror and one back into a free block."""
    runner = _runner(tiny_vllm_config())
    handler = CpuGpuOffloadingHandler(runner.layer_kv_caches, num_cpu_blocks=2, vllm_config=runner.vllm_config)
    handler.swap_out([0, 2], [0, 1])
    handler.swap_in([1], [1])
    return {"cpu_caches": handler.cpu_caches, "gpu_caches": runner.layer_kv_caches}


def build_offload_replay_rows():
    """Offloaded slots brought back as a gathered pool."""
    runner = _runner(tiny_vllm_config())
    handler = CpuGpuOffloadingHandler(runner.layer_kv_caches, num_cpu_blocks=2, vllm_config=runner.vllm_config)
    handler.swap_out([0, 2], [0, 1])
    return {"restored": handler.load_replay_rows([1, 0]), "cpu_caches": handler.cpu_caches}


def build_offload_transfer_buffers():
    """The connector's host transfer buffers for every layer."""
    runner = _runner(tiny_vllm_config())
    specs = runner.get_kv_cache_spec()
    buffers = allocate_transfer_buffers(specs, num_blocks=2, pin_memory=is_pin_memory_available())
    return {"transfer_buffers": buffers}
