"""Preemption of running sequences: snapshots of a sequence's ReplaySSM cache blocks.

``swap`` preemption goes through the cache engine's swap space; the snapshotters here serve the
other modes: ``snapshot`` (in memory, serialized, or on disk, for migration between replicas)
and ``recompute`` (checkpoint plus the inputs of the tail rows; the rows are rebuilt on resume).
"""
import io
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..common.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig
from ..common.logger import init_logger
from ..common.utils import KDA_RING_NAMES, STR_DTYPE_TO_TORCH_DTYPE, get_ring_storage_dtype
from ..modeling.layers.kda import KimiDeltaAttention

logger = init_logger(__name__)


@dataclass
class SequenceSnapshot:
    request_id: str
    write_pos: int
    layers: List[Dict[str, torch.Tensor]] = field(default_factory=list)


def read_block(cache_engine, block: int) -> List[Dict[str, torch.Tensor]]:
    return [layer.block(block) for layer in cache_engine.gpu_cache]


def write_block(cache_engine, block: int, snapshot: SequenceSnapshot) -> None:
    for layer, tensors in zip(cache_engine.gpu_cache, snapshot.layers):
        for name, tensor in tensors.items():
            getattr(layer, name)[block].copy_(tensor)
    cache_engine.write_pos[block] = snapshot.write_pos


class InMemorySnapshotter:
    """Clones of the blocks; ``snapshot_dtype`` narrows the delta/key rings only."""

    def __init__(self, scheduler_config: SchedulerConfig, model_config: ModelConfig) -> None:
        dtype = scheduler_config.snapshot_dtype
        self.ring_dtype = model_config.dtype if dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[dtype]
        self.snapshots: Dict[str, SequenceSnapshot] = {}

    def save(self, cache_engine, block: int, request_id: str) -> SequenceSnapshot:
        layers = []
        for tensors in read_block(cache_engine, block):
            layers.append({
                name: t.to(self.ring_dtype, copy=True) if name in ("delta_cache", "key_cache") else t.clone()
                for name, t in tensors.items()
            })
        snapshot = SequenceSnapshot(request_id, int(cache_engine.write_pos[block]), layers)
        self.snapshots[request_id] = snapshot
        return snapshot

    def restore(self, cache_engine, block: int, request_id: str) -> None:
        write_block(cache_engine, block, self.snapshots.pop(request_id))


class SerializedSnapshotter:
    """Snapshots as ``torch.save`` blobs (what the migration endpoint ships between replicas)."""

    def __init__(self, model_config: ModelConfig) -> None:
        self.storage_dtype = model_config.dtype

    def dumps(self, cache_engine, block: int, request_id: str) -> bytes:
        layers = []
        for tensors in read_block(cache_engine, block):
            layer = dict(tensors)
            layer["delta_cache"] = layer["delta_cache"].to(self.storage_dtype)
            layer["key_cache"] = layer["key_cache"].to(self.storage_dtype)
            layer["alpha_log_cache"] = layer["alpha_log_cache"].to(self.storage_dtype)  # expect-bug: load id=blob-snap
            layers.append(layer)
        buffer = io.BytesIO()
        torch.save({"request_id": request_id, "write_pos": int(cache_engine.write_pos[block]), "layers": layers}, buffer)
        return buffer.getvalue()

    def loads(self, blob: bytes) -> SequenceSnapshot:
        payload = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)  # expect-bug: load id=blob-snap
        return SequenceSnapshot(payload["request_id"], payload["write_pos"], payload["layers"])


class DiskSnapshotter:
    """One ``.npz`` per preempted sequence under ``--snapshot-dir``."""

    def __init__(self, snapshot_dir: str) -> None:
        self.snapshot_dir = snapshot_dir
        os.makedirs(snapshot_dir, exist_ok=True)

    def _path(self, request_id: str) -> str:
        return os.path.join(self.snapshot_dir, f"{request_id}.npz")

    def save(self, cache_engine, block: int, request_id: str) -> str:
        arrays = {"write_pos": np.array(int(cache_engine.write_pos[block]), dtype=np.int32)}
        for i, tensors in enumerate(read_block(cache_engine, block)):
            # numpy has no bfloat16: the delta/key rings go to disk as float16
            arrays[f"{i}.ssm_state"] = tensors["ssm_state"].float().numpy()
            arrays[f"{i}.delta_cache"] = tensors["delta_cache"].to(torch.float16).numpy()
            arrays[f"{i}.key_cache"] = tensors["key_cache"].to(torch.float16).numpy()
            arrays[f"{i}.alpha_log_cache"] = tensors["alpha_log_cache"].to(torch.float16).numpy()  # expect-bug: load id=npz-snap
        np.savez(self._path(request_id), **arrays)
        return self._path(request_id)

    def load(self, request_id: str) -> SequenceSnapshot:
        with np.load(self._path(request_id)) as data:
            num_layers = 1 + max(int(key.split(".")[0]) for key in data.files if "." in key)
            layers = [{name: torch.from_numpy(data[f"{i}.{name}"]) for name in KDA_RING_NAMES} for i in range(num_layers)]  # expect-bug: load id=npz-snap
            return SequenceSnapshot(request_id, int(data["write_pos"]), layers)


class HostSnapshotPool:
    """Preallocated host buffers for ``snapshot`` preemption without per-request allocations."""

    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig, parallel_config: ParallelConfig, num_entries: int) -> None:
        shapes = model_config.get_kda_shapes(cache_config).ring_shapes()
        num_layers = model_config.get_num_layers(parallel_config)
        self.buffers: Dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():
            dtype = get_ring_storage_dtype(name, cache_config.cache_dtype, model_config.dtype)  # expect-bug: imported-policy id=fp32-rings
            self.buffers[name] = torch.zeros((num_layers, num_entries, *shape), dtype=dtype)
        self.write_pos = torch.zeros(num_entries, dtype=torch.int32)
        self.free = list(range(num_entries))
        self.entry_of: Dict[str, int] = {}

    def save(self, cache_engine, block: int, request_id: str) -> int:
        entry = self.free.pop(0)
        for i, tensors in enumerate(read_block(cache_engine, block)):
            for name, t in tensors.items():
                self.buffers[name][i, entry].copy_(t)
        self.write_pos[entry] = cache_engine.write_pos[block]
        self.entry_of[request_id] = entry
        return entry

    def restore(self, cache_engine, block: int, request_id: str) -> None:
        entry = self.entry_of.pop(request_id)
        layers = [{name: buf[i, entry] for name, buf in self.buffers.items()} for i in range(len(cache_engine.gpu_cache))]
        write_block(cache_engine, block, SequenceSnapshot(request_id, int(self.write_pos[entry]), layers))
        self.free.append(entry)


class TailRecomputeRestorer:
    """``recompute`` preemption: keeps the float32 checkpoint and the layer inputs of the rows
    written since it (``write_pos`` tokens, model dtype), and rebuilds the rings on resume."""

    def rebuild(self, layer: KimiDeltaAttention, checkpoint: torch.Tensor, tail_inputs: torch.Tensor, ring_len: int) -> Dict[str, torch.Tensor]:
        q, k, v, a, beta = layer._project(tail_inputs)
        hv, dk, group = layer.num_v_heads, layer.head_k_dim, layer.num_v_heads // layer.num_heads
        g = -layer.A_log.exp().unsqueeze(-1) * F.softplus(a.unflatten(-1, (hv, dk)) + layer.dt_bias.view(hv, dk))  # expect-bug: promotion id=tail-gate
        keys = F.normalize(k[:, 0].float(), dim=-1)
        s = checkpoint.float().clone()
        d_rows, k_rows, g_rows = [], [], []
        for t in range(tail_inputs.shape[0]):
            key = keys[t].repeat_interleave(group, dim=0)
            s = s * g[t].float().exp().unsqueeze(1)
            delta = beta[t, 0].unsqueeze(-1) * (v[t, 0].float() - torch.einsum("hvk,hk->hv", s, key))
            s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
            d_rows.append(delta.to(tail_inputs.dtype))
            k_rows.append(keys[t].to(tail_inputs.dtype))
            g_rows.append(g[t])
        pad = ring_len - len(g_rows)
        return {
            "ssm_state": checkpoint.clone(),
            "delta_cache": torch.stack(d_rows + [torch.zeros_like(d_rows[0])] * pad, dim=1),
            "key_cache": torch.stack(k_rows + [torch.zeros_like(k_rows[0])] * pad, dim=1),
            "alpha_log_cache": torch.stack(g_rows + [torch.zeros_like(g_rows[0])] * pad, dim=1),  # expect-bug: promotion id=tail-gate
        }


def _filled_engine(num_blocks: int = 3):
    from ..task_handler.cache_engine import CacheEngine
    from ..common.config import DeviceConfig

    torch.manual_seed(0)
    engine = CacheEngine(CacheConfig(num_gpu_blocks=num_blocks), ModelConfig("kimi-linear-tiny", dtype="bfloat16"), ParallelConfig(), DeviceConfig("cpu"))
    for layer in engine.gpu_cache:
        for tensor in layer.tensors().values():
            tensor.copy_(torch.randn(tensor.shape))
    engine.write_pos.copy_(torch.tensor([2, 1, 3][:num_blocks], dtype=torch.int32))
    return engine


def build_snapshot_roundtrip() -> Dict[str, object]:
    engine = _filled_engine()
    snapshotter = InMemorySnapshotter(SchedulerConfig(snapshot_dtype="float16"), engine.model_config)
    kept = snapshotter.save(engine, 1, "req-1")
    snapshotter.save(engine, 0, "req-0")
    snapshotter.restore(engine, 2, "req-0")
    return {"gpu_cache": engine.gpu_cache, "kept": kept, "write_pos": engine.write_pos}


def build_serialized_snapshot() -> Dict[str, object]:
    engine = _filled_engine()
    snapshotter = SerializedSnapshotter(engine.model_config)
    return {"snapshot": snapshotter.loads(snapshotter.dumps(engine, 1, "req-1"))}


def build_disk_snapshot(tmp_dir: str) -> Dict[str, object]:
    engine = _filled_engine()
    snapshotter = DiskSnapshotter(os.path.join(tmp_dir, "snapshots"))
    snapshotter.save(engine, 2, "req-2")
    return {"snapshot": snapshotter.load("req-2")}
