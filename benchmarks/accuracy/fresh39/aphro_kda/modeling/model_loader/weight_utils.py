"""Utilities for locating and iterating model weights (safetensors, PyTorch bins, numpy cache)."""
import glob
import json
import os
import struct
from typing import Any, Dict, Generator, Iterable, List, Optional, Tuple

import numpy as np
import torch

from ...common.logger import init_logger

logger = init_logger(__name__)

_SAFETENSORS_DTYPES: Dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_TORCH_TO_SAFETENSORS = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


def save_safetensors(tensors: Dict[str, torch.Tensor], path: str, metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes ``tensors`` in the safetensors layout (8-byte header size, JSON header, raw data)."""
    header: Dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    blobs, offset = [], 0
    for name, tensor in sorted(tensors.items()):
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _TORCH_TO_SAFETENSORS[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def safetensors_weights_iterator(hf_weights_files: List[str]) -> Generator[Tuple[str, torch.Tensor], None, None]:
    """Iterate over the weights in the model safetensor files."""
    for st_file in hf_weights_files:
        with open(st_file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
            data = f.read()
        header.pop("__metadata__", None)
        for name, info in header.items():
            start, end = info["data_offsets"]
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            flat = torch.frombuffer(bytearray(data[start:end]), dtype=torch.uint8) if end > start else torch.empty(0, dtype=torch.uint8)
            yield name, flat.view(dtype).reshape(info["shape"])


def pt_weights_iterator(hf_weights_files: List[str]) -> Generator[Tuple[str, torch.Tensor], None, None]:
    """Iterate over the weights in the model bin/pt files."""
    for bin_file in hf_weights_files:
        state = torch.load(bin_file, map_location="cpu", weights_only=True)
        yield from state.items()
        del state


def np_cache_weights_iterator(
    model_name_or_path: str, cache_dir: Optional[str], hf_folder: str, hf_weights_files: List[str]
) -> Generator[Tuple[str, torch.Tensor], None, None]:
    """Iterate over the weights through a numpy cache folder (float32 arrays; numpy has no bf16)."""
    np_folder = os.path.join(cache_dir or hf_folder, "np")
    os.makedirs(np_folder, exist_ok=True)
    weight_names_file = os.path.join(np_folder, "weight_names.json")
    if not os.path.exists(weight_names_file):
        weight_names = []
        for name, param in pt_weights_iterator(hf_weights_files):
            np.save(os.path.join(np_folder, name), param.float().cpu().numpy())
            weight_names.append(name)
        with open(weight_names_file, "w") as f:
            json.dump(weight_names, f)
    with open(weight_names_file) as f:
        weight_names = json.load(f)
    for name in weight_names:
        yield name, torch.from_numpy(np.load(os.path.join(np_folder, f"{name}.npy")))


def prepare_hf_weight_files(model_name_or_path: str, load_format: str) -> Tuple[str, List[str], bool]:
    patterns = {"safetensors": ["*.safetensors"], "pt": ["*.pt", "*.bin"], "npcache": ["*.bin", "*.pt"]}
    use_safetensors = load_format in ("auto", "safetensors")
    for pattern in patterns.get(load_format, ["*.safetensors", "*.bin", "*.pt"]):
        files = sorted(glob.glob(os.path.join(model_name_or_path, pattern)))
        if files:
            return model_name_or_path, files, pattern == "*.safetensors" and use_safetensors
    raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")


def initialize_dummy_weights(model: torch.nn.Module, low: float = -1e-3, high: float = 1e-3, seed: int = 1234) -> None:
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        if torch.is_floating_point(param):
            param.data.copy_(torch.rand(param.shape, generator=generator, dtype=torch.float32) * (high - low) + low)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    assert param.size() == loaded_weight.size(), f"{param.size()} != {loaded_weight.size()}"
    param.data.copy_(loaded_weight)


def iterate_weights(model_name_or_path: str, load_format: str, cache_dir: Optional[str] = None) -> Iterable[Tuple[str, torch.Tensor]]:
    hf_folder, files, use_safetensors = prepare_hf_weight_files(model_name_or_path, load_format)
    if load_format == "npcache":
        return np_cache_weights_iterator(model_name_or_path, cache_dir, hf_folder, files)
    return safetensors_weights_iterator(files) if use_safetensors else pt_weights_iterator(files)
