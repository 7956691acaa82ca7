"""Swapping the KDA state of preempted sequences out of the BufferCache: to a host arena
(``SwapSpace``) for short preemptions, to disk (``spill``) for long ones."""
import json
import math
from pathlib import Path
from typing import Dict, Union

import torch

from . import args as model_args
from .cache import BufferCache

# tensors whose dtype does not follow the cache's
_FIXED_DTYPES = {"state": torch.float32, "write_pos": torch.int32}


class SwapSpace:
    """Host copies of the KDA state of up to ``num_host_slots`` sequences (pinned on CUDA)."""

    def __init__(self, cache: BufferCache, num_host_slots: int, pin_memory: bool = False):
        self.host = {
            name: torch.zeros((t.shape[0], num_host_slots, *t.shape[2:]), dtype=model_args.host_dtype(name, cache.dtype), pin_memory=pin_memory)
            for name, t in cache.kda_tensors().items()
        }

    def swap_out(self, cache: BufferCache, seq: int, host_slot: int) -> None:
        for name, t in cache.kda_tensors().items():
            self.host[name][:, host_slot].copy_(t[:, seq], non_blocking=True)

    def swap_in(self, cache: BufferCache, host_slot: int, seq: int) -> None:
        for name, t in cache.kda_tensors().items():
            t[:, seq].copy_(self.host[name][:, host_slot], non_blocking=True)


def spill(cache: BufferCache, seq: int, path: Union[Path, str]) -> None:
    """Writes sequence ``seq``'s KDA state to ``path``: a JSON header line, then the raw bytes."""
    header = {"dtype": str(cache.dtype).removeprefix("torch."), "tensors": {}}  # expect-bug: load id=spill-dtype
    blobs, offset = [], 0
    for name, t in cache.kda_tensors().items():
        row = t[:, seq].contiguous().cpu()
        header["tensors"][name] = {"shape": list(row.shape), "offset": offset}
        blobs.append(row.view(torch.uint8).numpy().tobytes())
        offset += len(blobs[-1])
    with open(path, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.writelines(blobs)


def read_spill(path: Union[Path, str]) -> Dict[str, torch.Tensor]:
    raw = Path(path).read_bytes()
    header_len = raw.index(b"\n") + 1
    header = json.loads(raw[:header_len])
    dtype, buf = model_args.dtype_from_str(header["dtype"]), bytearray(raw[header_len:])
    rows = {}
    for name, meta in header["tensors"].items():
        row = torch.frombuffer(buf, dtype=_FIXED_DTYPES.get(name, dtype), count=math.prod(meta["shape"]), offset=meta["offset"])  # expect-bug: load id=spill-dtype
        rows[name] = row.view(meta["shape"]).clone()
    return rows


def restore(cache: BufferCache, seq: int, rows: Dict[str, torch.Tensor]) -> None:
    for name, t in cache.kda_tensors().items():
        t[:, seq].copy_(rows[name])


def spill_pt(cache: BufferCache, seq: int, path: Union[Path, str]) -> None:
    """``spill`` through torch.save: slower to write, but each tensor keeps its dtype."""
    torch.save({name: t[:, seq].clone() for name, t in cache.kda_tensors().items()}, path)


def read_spill_pt(path: Union[Path, str]) -> Dict[str, torch.Tensor]:
    return torch.load(str(path), mmap=True, weights_only=True)


def _cache_after_generate() -> BufferCache:
    from .generate import generate
    from .testing import random_transformer, tiny_cache

    model = random_transformer(torch.bfloat16)
    cache = tiny_cache(model)
    generate([[1, 2, 3], [4, 5, 6]], model, max_tokens=2, temperature=0.0, cache=cache)
    return cache


def build_swap_roundtrip():
    cache = _cache_after_generate()
    space = SwapSpace(cache, num_host_slots=2)
    space.swap_out(cache, seq=0, host_slot=1)
    space.swap_in(cache, host_slot=1, seq=0)
    return {"cache": cache, "host": space.host}


def build_disk_spill(tmp_dir):
    cache, path = _cache_after_generate(), Path(tmp_dir) / "seq0.kda"
    spill(cache, 0, path)
    rows = read_spill(path)
    restore(cache, 1, rows)
    return {"cache": cache, "rows": rows}


def build_pt_spill(tmp_dir):
    cache, path = _cache_after_generate(), Path(tmp_dir) / "seq0.pt"
    spill_pt(cache, 0, path)
    rows = read_spill_pt(path)
    restore(cache, 1, rows)
    return {"cache": cache, "rows": rows}
