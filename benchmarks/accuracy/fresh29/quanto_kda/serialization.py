"""A safetensors-like format (8-byte header size, JSON header, raw bytes), quantized checkpoints
(``model.safetensors`` + ``quantization_map.json`` + ``config.json``) and cache snapshots."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch

from .cache import QuantizedCacheConfig, QuantizedKDACache
from .model import KDAConfig, KDAModel, ring_shapes
from .quantize import freeze, quantization_map, quantize, requantize
from .tensor import qint8

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I8": torch.int8, "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64}
_ST_NAMES = {dtype: name for name, dtype in _ST_DTYPES.items()}


def save_file(tensors: dict[str, torch.Tensor], path: str) -> None:
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()  # the tensor's bytes, any dtype
        header[name] = {"dtype": _ST_NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + b"".join(chunks))


def load_file(path: str) -> dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header, data = json.loads(f.read(size)), f.read()
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[start:end]), dtype=torch.uint8)
        tensors[name] = raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


def save_quantized(model: KDAModel, save_dir: str, slots: int, dtype: torch.dtype | None = None) -> None:
    """Write a quantized checkpoint; ``dtype`` stores the float tensors at lower precision."""
    os.makedirs(save_dir, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        keep = not tensor.is_floating_point() or name.endswith(("_scale", ".state"))
        tensors[name] = tensor if dtype is None or keep else tensor.to(dtype)  # expect-bug: load id=half-ckpt
    save_file(tensors, os.path.join(save_dir, "model.safetensors"))
    for name, meta in (("quantization_map", quantization_map(model)), ("config", {**dataclasses.asdict(model.config), "slots": slots})):
        with open(os.path.join(save_dir, f"{name}.json"), "w") as f:
            json.dump(meta, f)


def load_quantized(save_dir: str, torch_dtype: torch.dtype = torch.bfloat16) -> KDAModel:
    with open(os.path.join(save_dir, "config.json")) as f:
        config = json.load(f)
    slots = config.pop("slots")
    model = KDAModel(KDAConfig(**config), dtype=torch_dtype)
    model.setup_caches(slots)
    with open(os.path.join(save_dir, "quantization_map.json")) as f:
        qmap = json.load(f)
    return requantize(model, load_file(os.path.join(save_dir, "model.safetensors")), qmap)


def export_npz(cache: QuantizedKDACache, path: str) -> None:
    """Rings for the numpy tools; numpy has no bfloat16, so the float rings go out as float16."""
    arrays = {}
    for name, tensor in cache.state_dict().items():
        low = tensor.is_floating_point() and name != "state" and not name.endswith(".scale")
        arrays[name] = (tensor.to(torch.float16) if low else tensor).numpy()  # expect-bug: load id=npz-half
    np.savez(path, **arrays)


def import_npz(cache: QuantizedKDACache, path: str) -> QuantizedKDACache:
    with np.load(path) as arrays:
        for name in arrays.files:
            cache.set_tensor(name, torch.from_numpy(arrays[name]))  # expect-bug: load id=npz-half
    return cache


def _served_model() -> KDAModel:
    model = KDAModel(KDAConfig(), dtype=torch.bfloat16)
    model.setup_caches(slots=2)
    quantize(model, weights=qint8)
    freeze(model)
    model.step(torch.tensor([[2], [7]]), torch.arange(2))
    return model

def build_checkpoint_roundtrip(tmp_dir):
    save_quantized(_served_model(), os.path.join(tmp_dir, "ckpt"), slots=2)
    model = load_quantized(os.path.join(tmp_dir, "ckpt"))
    model.step(torch.tensor([[1], [1]]), torch.arange(2))
    return model

def build_half_checkpoint(tmp_dir):
    save_quantized(_served_model(), os.path.join(tmp_dir, "ckpt"), slots=2, dtype=torch.float16)
    model = load_quantized(os.path.join(tmp_dir, "ckpt"), torch_dtype=torch.float16)
    model.step(torch.tensor([[1], [1]]), torch.arange(2))
    return model

def build_cache_snapshot_roundtrip(tmp_dir):
    shapes = ring_shapes(KDAConfig(), 2)
    cache = QuantizedKDACache(shapes, QuantizedCacheConfig("qint8"))
    for _ in range(2):
        q, k, v = (torch.randn(2, 2, 4, dtype=torch.bfloat16) for _ in range(3))
        cache.decode(q, k, v, -torch.rand(2, 2, 4), torch.rand(2, 2, dtype=torch.bfloat16), torch.arange(2))
    path = os.path.join(tmp_dir, "cache.safetensors")
    save_file(cache.state_dict(), path)
    restored = QuantizedKDACache(shapes, QuantizedCacheConfig("qint8"))
    restored.load_state_dict(load_file(path))
    return {"saved": cache, "restored": restored}
