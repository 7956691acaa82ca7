"""Saving, restoring and swapping ReplaySSM ring pools (host memory and files)."""

import json
import math
from pathlib import Path
from typing import Dict, Union

import numpy as np
import torch

from .decode import random_decode_inputs, BatchKDADecodeWithReplayRingWrapper
from .page import ReplayRingPool, RingDataTypes, RingShape
from .utils import canonicalize_torch_dtype, get_index_data_type, get_state_data_type

POOL_TENSORS = ("ssm_state", "delta_buf", "key_buf", "log_decay_buf", "write_pos")
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int32: np.int32}


def save_ring_snapshot(pool: ReplayRingPool, path: Union[str, Path]) -> None:
    torch.save({name: getattr(pool, name) for name in POOL_TENSORS}, path)


def restore_ring_snapshot(pool: ReplayRingPool, path: Union[str, Path]) -> ReplayRingPool:
    """Copies a snapshot into ``pool``'s tensors, which keep their dtypes."""
    blob = torch.load(path, weights_only=True)
    for name in POOL_TENSORS:
        getattr(pool, name).copy_(blob[name])
    return pool


def dump_rings_raw(pool: ReplayRingPool, folder: Union[str, Path]) -> None:
    """One ``<name>.bin`` of raw bytes per tensor and a ``meta.json`` with dtypes and shapes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {}
    for name in POOL_TENSORS:
        tensor = getattr(pool, name).contiguous()
        tensor.view(torch.uint8).numpy().tofile(folder / f"{name}.bin")
        meta[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
    (folder / "meta.json").write_text(json.dumps(meta))


def read_ring_bytes(folder: Union[str, Path], name: str) -> torch.Tensor:
    """One tensor of a raw dump, in the dtype and shape its ``meta.json`` records."""
    folder = Path(folder)
    entry = json.loads((folder / "meta.json").read_text())[name]
    raw = bytearray((folder / f"{name}.bin").read_bytes())
    return torch.frombuffer(raw, dtype=canonicalize_torch_dtype(entry["dtype"])).view(entry["shape"])


def load_rings_raw(folder: Union[str, Path], shape: RingShape, kv_data_type: Union[str, torch.dtype]) -> Dict[str, torch.Tensor]:
    """Maps a raw dump back into tensors with ``torch.from_file``."""
    folder = Path(folder)
    kv = canonicalize_torch_dtype(kv_data_type)

    def read(name, dims, dtype):
        return torch.from_file(str(folder / f"{name}.bin"), shared=False, size=math.prod(dims), dtype=dtype).view(dims)

    return {
        "ssm_state": read("ssm_state", shape.state(), get_state_data_type(kv)),
        "delta_buf": read("delta_buf", shape.delta(), kv),
        "key_buf": read("key_buf", shape.key(), kv),
        "log_decay_buf": read("log_decay_buf", shape.log_decay(), kv),  # expect-bug: load
        "write_pos": read("write_pos", (shape.num_slots,), get_index_data_type()),
    }


def load_rings_numpy(folder: Union[str, Path], shape: RingShape, kv_data_type: Union[str, torch.dtype]) -> Dict[str, torch.Tensor]:
    """Reads a raw dump of a pool whose rings numpy can represent (fp16 or fp32 kv)."""
    folder = Path(folder)
    np_kv = _NUMPY_DTYPES[canonicalize_torch_dtype(kv_data_type)]
    rings = {}
    for name, dims in (("ssm_state", shape.state()), ("delta_buf", shape.delta()), ("key_buf", shape.key())):
        rings[name] = torch.from_numpy(np.fromfile(folder / f"{name}.bin", dtype=np_kv).reshape(dims))
    rings["log_decay_buf"] = torch.from_numpy(np.fromfile(folder / "log_decay_buf.bin", dtype=np_kv, count=math.prod(shape.log_decay())).reshape(shape.log_decay()))  # expect-bug: load
    rings["write_pos"] = torch.from_numpy(np.fromfile(folder / "write_pos.bin", dtype=np.int32))
    return rings


class HostSwapSpace:
    """Host copies of up to ``num_host_slots`` slots of a pool, for preempted requests."""

    def __init__(self, pool: ReplayRingPool, num_host_slots: int) -> None:
        n = num_host_slots
        self.ssm_state = pool.ssm_state.new_zeros((n, *pool.ssm_state.shape[1:]))
        self.delta_buf = pool.delta_buf.new_zeros((n, *pool.delta_buf.shape[1:]))
        self.key_buf = torch.zeros_like(pool.key_buf[:n])
        self.log_decay_buf = torch.zeros_like(pool.delta_buf[:n])  # expect-bug: like
        self.write_pos = torch.zeros(n, dtype=get_index_data_type())
        self.resident: Dict[int, int] = {}

    def swap_out(self, pool: ReplayRingPool, slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        for slot, host in zip(slots.tolist(), host_slots.tolist()):
            for name in POOL_TENSORS:
                getattr(self, name)[host].copy_(getattr(pool, name)[slot])
            self.resident[slot] = host

    def swap_in(self, pool: ReplayRingPool, slots: torch.Tensor) -> None:
        for slot in slots.tolist():
            host = self.resident.pop(slot)
            for name in POOL_TENSORS:
                getattr(pool, name)[slot].copy_(getattr(self, name)[host])


def export_slots(pool: ReplayRingPool, slots: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Copies of the tensors of ``slots``, for handing them to another pool."""
    idx = slots.long()
    return {
        "ssm_state": pool.ssm_state[idx].clone(),
        "delta_buf": pool.delta_buf[idx].clone(),
        "key_buf": pool.key_buf[idx].clone(),
        "log_decay_buf": pool.log_decay_buf[idx].type_as(pool.key_buf),  # expect-bug: cast
        "write_pos": pool.write_pos[idx].clone(),
    }


def import_slots(pool: ReplayRingPool, exported: Dict[str, torch.Tensor], slots: torch.Tensor) -> None:
    """Copies exported slots into ``slots`` of ``pool`` (in the pool's dtypes)."""
    for i, slot in enumerate(slots.tolist()):
        for name in POOL_TENSORS:
            getattr(pool, name)[slot].copy_(exported[name][i])


SHAPE = RingShape(num_slots=4, num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4)


def _warm(pool: ReplayRingPool, n: int, steps: int, dtype: torch.dtype) -> torch.Tensor:
    slots = pool.alloc(n)
    wrapper = BatchKDADecodeWithReplayRingWrapper(torch.zeros(1 << 16, dtype=torch.uint8))
    for _ in range(steps):
        indptr, indices, last_page_len = pool.page_table(slots)
        wrapper.plan(indptr, indices, last_page_len, 2, 2, 8, 8, SHAPE.ring_len, q_data_type=dtype, kv_data_type=pool.delta_buf.dtype)
        mixed_qkv, a, b, A_log, dt_bias = random_decode_inputs(n, 2, 2, 8, 8, dtype)
        wrapper.run(mixed_qkv, a, b, pool.ring_cache(), A_log, dt_bias)
        pool.advance(slots)
    return slots


def build_snapshot_roundtrip(tmp_dir):
    """A bf16 pool saved and restored with torch, dumped raw and read back, and swapped through host memory."""
    torch.manual_seed(41)
    pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv("bf16"))
    slots = _warm(pool, 3, 2, torch.bfloat16)
    path = Path(tmp_dir) / "rings.pt"
    save_ring_snapshot(pool, path)
    restored = restore_ring_snapshot(ReplayRingPool(SHAPE, RingDataTypes.for_kv("bf16")), path)

    dump_rings_raw(pool, Path(tmp_dir) / "raw")
    read_back = {name: read_ring_bytes(Path(tmp_dir) / "raw", name) for name in ("delta_buf", "log_decay_buf", "write_pos")}
    log_decay_bytes = pool.log_decay_buf.view(torch.uint8)

    staging = pool.scratch()
    exported = {name: getattr(pool, name)[slots.long()].clone() for name in POOL_TENSORS}
    import_slots(staging, exported, torch.tensor([3, 2, 1], dtype=torch.int32))
    return {
        "pool": pool,
        "restored": restored,
        "read_back": read_back,
        "log_decay_bytes": log_decay_bytes,
        "staging": staging,
    }


def build_raw_swap(tmp_dir):
    """A bf16 pool dumped raw and mapped back with from_file, and two slots swapped out to host memory."""
    torch.manual_seed(42)
    pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv("bf16"))
    slots = _warm(pool, 2, 3, torch.bfloat16)
    dump_rings_raw(pool, Path(tmp_dir) / "raw")
    restored = load_rings_raw(Path(tmp_dir) / "raw", SHAPE, "bf16")
    swap = HostSwapSpace(pool, num_host_slots=2)
    swap.swap_out(pool, slots, torch.tensor([1, 0], dtype=torch.int32))
    pool.reset(slots)
    swap.swap_in(pool, slots[:1])
    return {"pool": pool, "restored": restored, "swap": swap}


def build_numpy_swap(tmp_dir):
    """An fp16 pool dumped raw and read with numpy, and two slots exported into a spawned pool."""
    torch.manual_seed(43)
    pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv("fp16"))
    slots = _warm(pool, 2, 2, torch.float16)
    dump_rings_raw(pool, Path(tmp_dir) / "raw")
    loaded = load_rings_numpy(Path(tmp_dir) / "raw", SHAPE, "fp16")
    exported = export_slots(pool, slots)
    spawned = pool.spawn(2)
    import_slots(spawned, exported, torch.tensor([0, 1], dtype=torch.int32))
    return {"pool": pool, "loaded": loaded, "exported": exported, "spawned": spawned}
