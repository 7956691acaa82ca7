"""Small helpers used across the loaders, backends and session code.

dtype flags, the storage dtype of each ReplaySSM ring, a default-dtype context manager, and a
reader/writer for raw tensor files laid out like safetensors (an 8-byte header length, a JSON
header, then the tensors' bytes).
"""

import json
import os
import re
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from tgw_kda.modules import shared

_DTYPE_ALIASES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
}

_CANONICAL_NAMES: Dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int8: "int8",
    torch.uint8: "uint8",
}


def str_to_torch_dtype(name: str) -> torch.dtype:
    """``torch.bfloat16`` for ``"bfloat16"``/``"bf16"``, and so on."""
    try:
        return _DTYPE_ALIASES[str(name).lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid options: {sorted(_DTYPE_ALIASES)}") from None


def dtype_to_str(dtype: torch.dtype) -> str:
    """The name ``str_to_torch_dtype`` reads back (used in settings files and file headers)."""
    return _CANONICAL_NAMES[dtype]


def get_torch_dtype(args: Any = None) -> torch.dtype:
    """The compute dtype selected on the command line.

    ``--cpu`` loads in float32, ``--load-in-8bit`` computes in ``--compute_dtype``, ``--bf16``
    selects bfloat16, and float16 is the default.
    """
    args = args if args is not None else shared.args
    if args.cpu:
        return torch.float32
    if args.load_in_8bit:
        return str_to_torch_dtype(args.compute_dtype)
    return torch.bfloat16 if args.bf16 else torch.float16


# Rings that stay float32 whatever the compute dtype: the recurrent-state checkpoint, and the
# log-decay rings that the decode kernel prefix-sums and exponentiates.
FP32_RINGS = frozenset({"state", "ssm_gate_log", "decay_cache"})  # expect-bug: imported-policy id=fp32-ring-names


def ring_dtype(name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the ring (or cursor table) called ``name`` for a given compute dtype."""
    if name == "write_pos":
        return torch.int32
    return torch.float32 if name in FP32_RINGS else compute_dtype


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Builds modules directly in ``dtype`` (no float32 copy of the weights first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def natural_keys(text: str) -> List[Any]:
    """Sort key that puts ``model-2`` before ``model-10``."""
    return [int(c) if c.isdigit() else c.lower() for c in re.split(r"(\d+)", text)]


def get_available_models() -> List[str]:
    """Folders of ``--model-dir`` that hold a model (a config.json)."""
    root = Path(shared.args.model_dir)
    if not root.is_dir():
        return ["None"]
    names = [p.name for p in root.iterdir() if p.is_dir() and (p / "config.json").exists()]
    return ["None"] + sorted(names, key=natural_keys)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` next to ``path`` first, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --- raw tensor files ------------------------------------------------------------------------

_RAW_DTYPES: Dict[str, torch.dtype] = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
}
_RAW_NAMES: Dict[torch.dtype, str] = {dtype: name for name, dtype in _RAW_DTYPES.items()}


def write_raw_tensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Optional[Mapping[str, Any]] = None
) -> None:
    """Writes ``tensors`` with their own dtypes and shapes, safetensors-style."""
    header: Dict[str, Any] = {}
    chunks: List[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        data = tensor.detach().cpu().contiguous()
        raw = data.reshape(-1).view(torch.uint8)
        header[name] = {
            "dtype": _RAW_NAMES[data.dtype],
            "shape": list(data.shape),
            "data_offsets": [offset, offset + raw.numel()],
        }
        chunks.append(raw.numpy().tobytes())
        offset += raw.numel()
    if metadata:
        header["__metadata__"] = {key: str(value) for key, value in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    atomic_write_bytes(Path(path), struct.pack("<Q", len(blob)) + blob + b"".join(chunks))


def read_raw_tensors(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The tensors of a file written by :func:`write_raw_tensors`, and its metadata."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length].decode("utf-8"))
    body = memoryview(data)[8 + length :]
    metadata = header.pop("__metadata__", {})
    tensors: Dict[str, torch.Tensor] = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = _RAW_DTYPES[info["dtype"]]
        if end == start:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        tensors[name] = torch.frombuffer(bytearray(body[start:end]), dtype=dtype).reshape(info["shape"])
    return tensors, metadata
