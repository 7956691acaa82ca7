"""KV connector that saves caches to and loads them from a shared directory
(vllm/distributed/kv_transfer/kv_connector/v1/shared_storage_connector.py).

Attention blocks are saved as they are; a KDA layer's slot is saved as its four states.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
from typing import Any

import torch

from vllm_v1_kda.config import KVTransferConfig, VllmConfig, tiny_vllm_config
from vllm_v1_kda.utils import get_kv_cache_torch_dtype
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayBackend, KDAReplayState
from vllm_v1_kda.v1.kv_cache_interface import KVCacheSpec, MambaSpec

logger = logging.getLogger(__name__)


class KVConnectorRole(enum.Enum):
    # Connector running in the scheduler process
    SCHEDULER = 0
    # Connector running in the worker process
    WORKER = 1


class KVConnectorBase_V1:
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole) -> None:
        self._vllm_config = vllm_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role


class SharedStorageConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        transfer_config = vllm_config.kv_transfer_config
        self._block_size = vllm_config.cache_config.block_size
        self._storage_path = transfer_config.get_from_extra_config("shared_storage_path", "/tmp")
        self._model_dtype = vllm_config.model_config.dtype
        self._kv_buffer_dtype = transfer_config.kv_buffer_dtype
        self._kv_caches: dict[str, Any] = {}
        logger.info("Shared storage path is %s", self._storage_path)

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._kv_caches = kv_caches

    def _generate_foldername_debug(self, request_id: str, create_folder: bool = False) -> str:
        foldername = os.path.join(self._storage_path, hashlib.md5(request_id.encode()).hexdigest())
        if create_folder:
            os.makedirs(foldername, exist_ok=True)
        return foldername

    def _generate_filename_debug(self, layer_name: str, request_id: str) -> str:
        foldername = self._generate_foldername_debug(request_id, create_folder=True)
        return os.path.join(foldername, f"{layer_name}.pt")

    def _wire_dtypes(self, kv_layer: KDAReplayState) -> dict[str, torch.dtype]:
        # rings go to storage in the model dtype (half the bytes of an fp32 ring);
        # the checkpoint state keeps the dtype it has in the pool
        return dict(zip(KDAReplayState._fields, (kv_layer.state.dtype, *(self._model_dtype,) * 3)))  # expect-bug: container

    def save_kv_layer(self, layer_name: str, kv_layer: Any, block_ids: list[int], request_id: str) -> str:
        """Saves the blocks of one request of one layer; returns the file."""
        filename = self._generate_filename_debug(layer_name, request_id)
        if isinstance(kv_layer, KDAReplayState):
            index = torch.tensor(block_ids[:1], dtype=torch.long, device=kv_layer.state.device)
            wire_dtypes = self._wire_dtypes(kv_layer)
            tensors = {
                name: tensor.index_select(0, index).to(device="cpu", dtype=wire_dtypes[name])
                for name, tensor in kv_layer._asdict().items()
            }
        else:
            index = torch.tensor(block_ids, dtype=torch.long, device=kv_layer.device)
            tensors = {"kv_cache": kv_layer.index_select(1, index).detach().cpu()}
        torch.save(tensors, filename)
        return filename

    def start_load_kv(self, layer_name: str, block_ids: list[int], request_id: str) -> None:
        """Loads one request's blocks of one layer into the registered caches (in place)."""
        filename = self._generate_filename_debug(layer_name, request_id)
        loaded = torch.load(filename, map_location="cpu", weights_only=True)
        kv_layer = self._kv_caches[layer_name]
        if isinstance(kv_layer, KDAReplayState):
            slot = block_ids[0]
            for name, dst in kv_layer._asdict().items():
                dst[slot] = loaded[name][0].to(dst.device)
        else:
            index = torch.tensor(block_ids, dtype=torch.long, device=kv_layer.device)
            kv_layer.index_copy_(1, index, loaded["kv_cache"].to(kv_layer.device))

    def allocate_recv_buffers(self, kv_cache_specs: dict[str, KVCacheSpec], num_blocks: int) -> dict[str, Any]:
        """Host landing buffers for asynchronous loads (read from storage off the critical path)."""
        buffer_dtype = get_kv_cache_torch_dtype(self._kv_buffer_dtype, self._model_dtype)
        buffers: dict[str, Any] = {}
        for layer_name, spec in kv_cache_specs.items():
            if isinstance(spec, MambaSpec):
                buffers[layer_name] = KDAReplayState(  # expect-bug: imported-policy
                    *(torch.zeros((num_blocks, *shape), dtype=buffer_dtype) for shape in spec.shapes)
                )
            else:
                buffers[layer_name] = torch.zeros(
                    (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size), dtype=spec.dtype
                )
        return buffers

    def describe_layer(self, layer_name: str) -> dict[str, str]:
        g_cache = KDAReplayBackend.GATE_STATE
        kv_layer = self._kv_caches[layer_name]
        if not isinstance(kv_layer, KDAReplayState):
            return {"kv_cache": str(kv_layer.dtype)}
        return {name: str(t.dtype) + (" (log-decays)" if name == g_cache else "") for name, t in kv_layer._asdict().items()}


def build_shared_storage_roundtrip(tmp_dir: str):
    """Save a request's blocks of every layer on one engine and load them on another."""
    from vllm_v1_kda.v1.worker.gpu_model_runner import _decode, _new_runner

    def config():
        return tiny_vllm_config(
            kv_transfer_config=KVTransferConfig(
                kv_connector="SharedStorageConnector",
                kv_connector_extra_config={"shared_storage_path": tmp_dir},
            )
        )

    producer = _new_runner(config())
    _decode(producer, num_steps=3)
    sender = SharedStorageConnector(producer.vllm_config, KVConnectorRole.WORKER)
    sender.register_kv_caches(producer.layer_kv_caches)
    saved = {}
    for layer_name, kv_layer in producer.layer_kv_caches.items():
        filename = sender.save_kv_layer(layer_name, kv_layer, [0], "req-0")
        saved[layer_name] = torch.load(filename, map_location="cpu", weights_only=True)

    consumer = _new_runner(config())
    receiver = SharedStorageConnector(consumer.vllm_config, KVConnectorRole.WORKER)
    receiver.register_kv_caches(consumer.layer_kv_caches)
    for layer_name in consumer.layer_kv_caches:
        receiver.start_load_kv(layer_name, [1], "req-0")
    return {"saved": saved, "consumer_kv_caches": consumer.layer_kv_caches}
