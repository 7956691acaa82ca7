"""``.safetensors`` files, with the ``safetensors`` package when it is installed, or else read and
written here (8-byte little-endian header size, JSON header, raw little-endian data)."""
import json
import struct
from typing import Dict, Optional

import torch

try:
    import safetensors.torch as _st
except ImportError:  # pragma: no cover - depends on the environment
    _st = None

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def load_file(filename: str, device: str = "cpu") -> Dict[str, torch.Tensor]:
    if _st is not None:
        return _st.load_file(filename, device=device)
    with open(filename, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        data = bytearray(f.read())
    header.pop("__metadata__", None)
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // dtype.itemsize
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start) if count else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"]).clone().to(device)
    return tensors


def save_file(tensors: Dict[str, torch.Tensor], filename: str, metadata: Optional[Dict[str, str]] = None) -> None:
    if _st is not None:
        return _st.save_file(tensors, filename, metadata=metadata)
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(filename, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.writelines(chunks)
