"""The object store path: a ``MooncakeDistributedStore`` stand-in and the KV client on top.

Instead of a point-to-point transfer, a prefill worker can publish a request's slots as one
blob per layer (``kda-state/<request>/<layer>``, the ``metadata`` format); any decode worker that
later picks the request up fetches them. ``HostOffloader`` parks idle requests on local disk.

Blobs written by prefill workers before 0.2 (``MCK1``: a JSON header and the rings as float16)
are still read so that a rolling upgrade can drain them.
"""

import json
import math
import os
import struct
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .config import KDAShapes, MooncakeTransferConfig, RingDtypes, str_to_torch_dtype
from .transfer.metadata import LEGACY_MAGIC, SlotLayoutMeta, deserialize_slot, serialize_slot

_MASTERS: Dict[str, Dict[str, bytes]] = {}


class MooncakeDistributedStore:
    def __init__(self) -> None:
        self._objects: Dict[str, bytes] = {}
        self._segment_size = 0

    def setup(
        self,
        local_hostname: str,
        metadata_server: str,
        global_segment_size: int,
        local_buffer_size: int,
        protocol: str,
        device_name: str,
        master_server_address: str,
    ) -> int:
        self._objects = _MASTERS.setdefault(master_server_address, {})
        self._segment_size = global_segment_size
        return 0

    def put(self, key: str, value: bytes) -> int:
        used = sum(len(blob) for name, blob in self._objects.items() if name != key)
        if used + len(value) > self._segment_size:
            return -1
        self._objects[key] = bytes(value)
        return 0

    def get(self, key: str) -> bytes:
        return self._objects.get(key, b"")

    def is_exist(self, key: str) -> int:
        return int(key in self._objects)

    def remove(self, key: str) -> int:
        return 0 if self._objects.pop(key, None) is not None else -1


def encode_legacy_blob(tensors: Mapping[str, Tensor]) -> bytes:
    """The ``MCK1`` layout: JSON shapes, then float32 state, float16 rings and int32 cursor."""
    header = json.dumps({"shapes": {name: list(t.shape) for name, t in tensors.items()}}).encode()
    parts = [LEGACY_MAGIC, struct.pack("<I", len(header)), header]
    for name, t in tensors.items():
        if name == "cursor":
            parts.append(t.to(torch.int32).numpy().tobytes())
        elif name == "ckpt_state":
            parts.append(t.float().numpy().tobytes())
        else:
            parts.append(t.to(torch.float16).numpy().tobytes())  # expect-bug: load id=legacy-blob
    return b"".join(parts)


def decode_legacy_blob(blob: bytes) -> Dict[str, Tensor]:
    (size,) = struct.unpack_from("<I", blob, 4)
    shapes = json.loads(blob[8 : 8 + size])["shapes"]
    offset, tensors = 8 + size, {}
    for name, shape in shapes.items():
        count = math.prod(shape)
        if name == "cursor":
            array = np.frombuffer(blob, dtype=np.int32, count=count, offset=offset)
        elif name == "ckpt_state":
            array = np.frombuffer(blob, dtype=np.float32, count=count, offset=offset)
        else:
            array = np.frombuffer(blob, dtype=np.float16, count=count, offset=offset)  # expect-bug: load id=legacy-blob
        tensors[name] = torch.from_numpy(array.copy()).reshape(shape)
        offset += array.nbytes
    return tensors


class KVStoreClient:
    def __init__(self, config: MooncakeTransferConfig) -> None:
        self.config = config
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(
            config.local_hostname,
            config.metadata_server,
            config.global_segment_size,
            config.local_buffer_size,
            config.protocol,
            config.device_name,
            config.master_server_address,
        )
        if rc != 0:
            raise RuntimeError(f"could not reach the store master at {config.master_server_address}")

    @staticmethod
    def key(request_id: str, layer: int) -> str:
        return f"kda-state/{request_id}/{layer}"

    def _get(self, request_id: str, layer: int) -> bytes:
        blob = self.store.get(self.key(request_id, layer))
        if not blob:
            raise KeyError(self.key(request_id, layer))
        return blob

    def put_state(self, request_id: str, layers: Sequence[Mapping[str, Tensor]], *, n_tokens: int, model_dtype: str) -> List[str]:
        keys = []
        for index, tensors in enumerate(layers):
            meta = SlotLayoutMeta.describe(index, n_tokens, tensors, model_dtype)
            if self.store.put(self.key(request_id, index), serialize_slot(meta, tensors)) != 0:
                raise RuntimeError(f"store is full ({self.config.global_segment_size} bytes)")
            keys.append(self.key(request_id, index))
        return keys

    def put_legacy(self, request_id: str, layers: Sequence[Mapping[str, Tensor]]) -> None:
        for index, tensors in enumerate(layers):
            self.store.put(self.key(request_id, index), encode_legacy_blob(tensors))

    def get_tensors(self, request_id: str, layer: int) -> Tuple[SlotLayoutMeta, Dict[str, Tensor]]:
        meta, views = deserialize_slot(self._get(request_id, layer))
        return meta, {name: view.clone() for name, view in views.items()}

    def get_into(self, request_id: str, caches: Sequence[object], slot: int) -> int:
        """Copies a published request into ``slot`` of ``caches``; its number of prompt tokens."""
        n_tokens = 0
        for index, cache in enumerate(caches):
            meta, views = deserialize_slot(self._get(request_id, index))
            cache.reset_slot(slot)
            cache.load_slot(slot, views)
            n_tokens = meta.n_tokens
        return n_tokens

    def get_state(self, request_id: str, num_layers: int) -> List[Dict[str, Tensor]]:
        """A published request as tensors of its own (a decode worker without a free slot)."""
        layers = []
        for index in range(num_layers):
            blob = self._get(request_id, index)
            if blob[:4] == LEGACY_MAGIC:
                layers.append(decode_legacy_blob(blob))
                continue
            meta, views = deserialize_slot(blob)
            dtype = str_to_torch_dtype(meta.model_dtype)
            rings = {e.name: torch.empty(e.shape, dtype=torch.float32 if e.name == "ckpt_state" else dtype) for e in meta.entries if e.name != "cursor"}  # expect-bug: pool-dtype
            for name, ring in rings.items():
                ring.copy_(views[name])
            rings["cursor"] = views["cursor"].clone()
            layers.append(rings)
        return layers


class HostOffloader:
    """Parks a request's slots on local disk (``torch.save``) while the decode pool is full."""

    def __init__(self, offload_dir: str, offload_dtype: Optional[torch.dtype] = None) -> None:
        self.offload_dir = offload_dir
        self.offload_dtype = offload_dtype
        os.makedirs(offload_dir, exist_ok=True)

    def path(self, request_id: str) -> str:
        return os.path.join(self.offload_dir, f"{request_id.replace('/', '_')}.pt")

    def offload(self, request_id: str, layers: Sequence[Mapping[str, Tensor]]) -> str:
        dtype = self.offload_dtype
        payload = [{name: (t.to(dtype) if dtype is not None and t.is_floating_point() and name != "ckpt_state" else t).clone() for name, t in tensors.items()} for tensors in layers]  # expect-bug: load id=offload
        torch.save(payload, self.path(request_id))
        return self.path(request_id)

    def restore(self, request_id: str) -> List[Dict[str, Tensor]]:
        return torch.load(self.path(request_id), map_location="cpu", weights_only=True)  # expect-bug: load id=offload

    def restore_into(self, request_id: str, caches: Sequence[object], slot: int) -> None:
        for cache, tensors in zip(caches, torch.load(self.path(request_id), map_location="cpu", weights_only=True)):
            cache.reset_slot(slot)
            cache.load_slot(slot, tensors)


def build_store_roundtrip(tmp_dir: str) -> Dict[str, object]:
    """A bf16 request published, fetched as tensors and into a slot; a second one offloaded in
    full precision and restored, as tensors and into a slot."""
    from .allocator import RingPool, prefilled_pools

    pools = prefilled_pools(torch.bfloat16, [3, 5, 7])
    layers = [pool.slot_tensors(0) for pool in pools]
    client = KVStoreClient(MooncakeTransferConfig(master_server_address="store-roundtrip:50051"))
    client.put_state("r0", layers, n_tokens=3, model_dtype="bfloat16")
    _, layer0 = client.get_tensors("r0", 0)
    target = [RingPool(KDAShapes(), 2, RingDtypes.for_model(torch.bfloat16)) for _ in pools]
    client.get_into("r0", target, 1)
    offloader = HostOffloader(os.path.join(tmp_dir, "offload"))
    offloader.offload("r1", layers)
    offloader.restore_into("r1", target, 0)
    return {"layer0": layer0, "pools": target, "restored": offloader.restore("r1")}


def build_store_restores(tmp_dir: str) -> Dict[str, object]:
    """A bf16 request offloaded in the model dtype and restored, fetched from the store as
    tensors, and fetched again from a pre-0.2 blob."""
    from .allocator import prefilled_pools

    pools = prefilled_pools(torch.bfloat16, [3, 5, 7])
    layers = [pool.slot_tensors(0) for pool in pools]
    offloader = HostOffloader(tmp_dir, offload_dtype=torch.bfloat16)
    offloader.offload("r1", layers)
    client = KVStoreClient(MooncakeTransferConfig(master_server_address="store-restores:50051"))
    client.put_state("r1", layers, n_tokens=3, model_dtype="bfloat16")
    client.put_legacy("r1-v1", layers)
    return {
        "offloaded": offloader.restore("r1"),
        "fetched": client.get_state("r1", len(layers)),
        "legacy": client.get_state("r1-v1", len(layers)),
    }
