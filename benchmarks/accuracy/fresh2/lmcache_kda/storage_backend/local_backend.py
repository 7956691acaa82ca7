import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import LMCacheEngineConfig, LMCacheEngineMetadata
from ..utils import TENSOR_FIELDS, CacheEngineKey, ReplayStateChunk, chunk_field_layout
from .abstract_backend import LMCBackendInterface

class PinnedChunkPool:
    """A host arena of `num_chunks` pages, each carved into the fields of a chunk with the layout of
    `utils.chunk_field_layout`: one (pinnable) allocation instead of four per stored chunk."""

    def __init__(self, metadata: LMCacheEngineMetadata, num_chunks: int):
        self.fields, self.page_nbytes = chunk_field_layout(metadata.layout, metadata.kv_dtype)
        self.arena = torch.zeros(num_chunks, self.page_nbytes, dtype=torch.uint8)
        self.free_pages = list(range(num_chunks))

    def allocate(self) -> Optional[tuple[int, dict[str, torch.Tensor]]]:
        if not self.free_pages:
            return None
        page, views = self.free_pages.pop(0), {}
        for field, shape, dtype, offset, nbytes in self.fields:
            views[field] = self.arena[page, offset : offset + nbytes].view(dtype).view(shape)  # expect-bug: imported-policy id=field-layout
        return page, views


class LMCLocalBackend(LMCBackendInterface):
    """Stores the ReplaySSM chunks in the local CPU memory (LRU)."""

    def __init__(self, config: LMCacheEngineConfig, metadata: LMCacheEngineMetadata):
        self.dict: OrderedDict[CacheEngineKey, ReplayStateChunk] = OrderedDict()
        self.pages: dict[CacheEngineKey, int] = {}
        self.max_size = int(config.max_local_cpu_size * 1024**3)
        self.pool = PinnedChunkPool(metadata, config.extra_config.get("pool_chunks", 8)) if config.pinned_cpu_pool else None
        self.size = 0

    def contains(self, key: CacheEngineKey) -> bool:
        return key in self.dict

    def _to_cpu(self, chunk: ReplayStateChunk) -> tuple[ReplayStateChunk, Optional[int]]:
        allocated = self.pool.allocate() if self.pool is not None else None
        if allocated is not None:
            page, cpu = allocated
        else:
            page, cpu = None, {f: torch.empty_like(t, device="cpu") for f, t in chunk.tensors().items()}
        for field, tensor in cpu.items():
            tensor.copy_(getattr(chunk, field), non_blocking=True)
        return ReplayStateChunk(write_pos=chunk.write_pos, **cpu), page

    def put(self, key: CacheEngineKey, chunk: ReplayStateChunk) -> None:
        while self.dict and self.size + chunk.nbytes > self.max_size:
            old_key, old_chunk = self.dict.popitem(last=False)
            self.size -= old_chunk.nbytes
            if old_key in self.pages:
                self.pool.free_pages.append(self.pages.pop(old_key))
        cpu_chunk, page = self._to_cpu(chunk)
        self.dict[key] = cpu_chunk
        if page is not None:
            self.pages[key] = page
        self.size += cpu_chunk.nbytes

    def get(self, key: CacheEngineKey) -> Optional[ReplayStateChunk]:
        chunk = self.dict.get(key)
        if chunk is not None:
            self.dict.move_to_end(key)
        return chunk


@dataclass
class DiskCacheMetadata:
    path: str
    shapes: dict[str, list[int]]
    write_pos: int


class LMCLocalDiskBackend(LMCBackendInterface):
    """Stores every field of a chunk as a raw file, read back zero-copy with `torch.from_file`."""

    def __init__(self, config: LMCacheEngineConfig, metadata: LMCacheEngineMetadata):
        self.path = config.local_disk
        os.makedirs(self.path, exist_ok=True)
        self.dtype = metadata.kv_dtype
        self.dict: dict[CacheEngineKey, DiskCacheMetadata] = {}

    def contains(self, key: CacheEngineKey) -> bool:
        return key in self.dict

    def put(self, key: CacheEngineKey, chunk: ReplayStateChunk) -> None:
        path = os.path.join(self.path, key.to_string().replace("/", "-").replace("@", "-"))
        shapes = {}
        for field, tensor in chunk.tensors().items():
            tensor = tensor.detach().cpu().contiguous()
            shapes[field] = list(tensor.shape)
            tensor.view(torch.uint8).numpy().tofile(f"{path}.{field}")
        self.dict[key] = DiskCacheMetadata(path, shapes, chunk.write_pos)

    def get(self, key: CacheEngineKey) -> Optional[ReplayStateChunk]:
        meta = self.dict.get(key)
        if meta is None:
            return None
        tensors = {}
        for field in TENSOR_FIELDS:
            shape = meta.shapes[field]
            dtype = torch.float32 if field == "ssm_state" else self.dtype  # expect-bug: load id=disk-read
            tensors[field] = torch.from_file(f"{meta.path}.{field}", shared=False, size=math.prod(shape), dtype=dtype).view(shape)  # expect-bug: load id=disk-read
        return ReplayStateChunk(write_pos=meta.write_pos, **tensors)


def _stored_chunk(lmcache_config: dict, instance_id: str):
    from ..integration.vllm.vllm_adapter import PROMPT, _stored

    engine, kv_caches = _stored(instance_id, lmcache_config)
    return {"chunk": engine.retrieve(PROMPT)[1], "kv_caches": kv_caches}


def build_local_cpu_backend():
    return _stored_chunk({"chunk_size": 8, "max_local_cpu_size": 1}, "local-backend")


def build_pinned_pool_backend():
    config = {"chunk_size": 8, "max_local_cpu_size": 1, "pinned_cpu_pool": True, "extra_config": {"pool_chunks": 4}}
    return _stored_chunk(config, "pinned-pool")


def build_disk_backend(tmp_dir):
    return _stored_chunk({"chunk_size": 8, "local_cpu": False, "local_disk": f"file://{tmp_dir}/lmcache"}, "local-disk")
