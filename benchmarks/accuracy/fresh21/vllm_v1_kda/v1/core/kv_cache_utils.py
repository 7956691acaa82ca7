"""Scheduler-side KV cache sizing (vllm/v1/core/kv_cache_utils.py)."""

from __future__ import annotations

import logging

from vllm_v1_kda.config import VllmConfig
from vllm_v1_kda.utils import human_readable_int
from vllm_v1_kda.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
)

logger = logging.getLogger(__name__)


def get_kv_cache_groups(kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """One group per distinct spec, attention groups first, in layer order within a group."""
    groups: dict[KVCacheSpec, list[str]] = {}
    for layer_name, spec in kv_cache_spec.items():
        groups.setdefault(spec, []).append(layer_name)
    ordered = sorted(groups.items(), key=lambda item: isinstance(item[0], MambaSpec))
    return [KVCacheGroupSpec(layer_names, spec) for spec, layer_names in ordered]


def get_num_blocks(vllm_config: VllmConfig, page_size_per_block: int, available_memory: int) -> int:
    num_blocks = int(available_memory // page_size_per_block)
    num_blocks = max(num_blocks, 0)
    if vllm_config.cache_config.num_gpu_blocks_override is not None:
        num_gpu_blocks_override = vllm_config.cache_config.num_gpu_blocks_override
        logger.info("Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d", num_blocks, num_gpu_blocks_override)
        num_blocks = num_gpu_blocks_override
    return num_blocks


def get_kv_cache_config(
    vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> KVCacheConfig:
    """Every layer gets a buffer of its own of ``num_blocks`` pages; the same ``num_blocks``
    for every layer, so that a request's block ids are valid in all of them."""
    page_size_per_block = sum(spec.page_size_bytes for spec in kv_cache_spec.values())
    num_blocks = get_num_blocks(vllm_config, page_size_per_block, available_memory)
    kv_cache_tensors = [
        KVCacheTensor(size=spec.page_size_bytes * num_blocks, shared_by=[layer_name])
        for layer_name, spec in kv_cache_spec.items()
    ]
    logger.info(
        "KV cache: %d blocks, %s bytes", num_blocks, human_readable_int(page_size_per_block * num_blocks)
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=kv_cache_tensors,
        kv_cache_groups=get_kv_cache_groups(kv_cache_spec),
    )
