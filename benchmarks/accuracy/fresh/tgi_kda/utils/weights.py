import json
import struct

import torch

# safetensors dtype tags
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32}
_TAGS = {dtype: tag for tag, dtype in _DTYPES.items()}


def save_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Serializes tensors in the safetensors layout (header size, JSON header, raw data)."""
    header: dict[str, object] = {"__metadata__": metadata or {}}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        info = {"dtype": _TAGS[tensor.dtype], "shape": list(tensor.shape)}
        header[name] = dict(info, data_offsets=[offset, offset + len(raw)])
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks)


def load_tensors(blob: bytes) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors-layout blob, in the dtype it was stored with."""
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_size])
    header.pop("__metadata__", None)
    body = memoryview(blob)[8 + header_size :]
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        data = torch.frombuffer(bytearray(body[start:end]), dtype=_DTYPES[info["dtype"]])
        tensors[name] = data.reshape(info["shape"])
    return tensors


class Weights:
    def __init__(self, filenames: dict[str, bytes], device: torch.device, dtype: torch.dtype):
        routing: dict[str, str] = {}
        self._handles = {filename: load_tensors(blob) for filename, blob in filenames.items()}
        for filename, handle in self._handles.items():
            for k in handle:
                if k in routing:
                    raise RuntimeError(
                        f"Key {k} was found in multiple files: {filename} and {routing[k]}"
                    )
                routing[k] = filename
        self.routing = routing
        self.device = device
        self.dtype = dtype

    def get_filename(self, tensor_name: str) -> tuple[str, str]:
        filename = self.routing.get(tensor_name, None)
        if filename is None:
            raise RuntimeError(f"weight {tensor_name} does not exist")
        return str(filename), tensor_name

    def get_tensor(
        self, tensor_name: str, to_device: bool = True, to_dtype: bool = True
    ) -> torch.Tensor:
        filename, tensor_name = self.get_filename(tensor_name)
        tensor = self._handles[filename][tensor_name]
        # Special case for gptq which shouldn't convert u4b32 to float16
        if tensor.dtype not in [torch.int16, torch.int32, torch.int64] and to_dtype:
            tensor = tensor.to(dtype=self.dtype)
        if to_device:
            tensor = tensor.to(device=self.device)
        return tensor
