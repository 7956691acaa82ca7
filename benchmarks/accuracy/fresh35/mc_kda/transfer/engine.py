"""A process-local stand-in for the Mooncake ``TransferEngine`` Python binding.

It keeps the binding's calls and return codes (``initialize``, ``register_memory``,
``transfer_sync_write``/``transfer_sync_read``, ``allocate_managed_buffer``, ...) so the
connector runs unchanged on a single host: every initialized engine joins an in-process
"cluster" by hostname, and a transfer copies bytes between registered regions. Regions are
flat ``uint8`` tensors; the connector reads typed rings out of them with :meth:`typed_view`.
"""

import math
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

_CLUSTER: Dict[str, "TransferEngine"] = {}


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class TransferEngine:
    def __init__(self) -> None:
        self.hostname: Optional[str] = None
        self.protocol: Optional[str] = None
        self._regions: Dict[int, Tensor] = {}

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        if protocol not in ("tcp", "rdma"):
            return -1
        self.hostname, self.protocol = local_hostname, protocol
        _CLUSTER[local_hostname] = self
        return 0

    def get_rpc_port(self) -> int:
        return 17000 + sum(map(ord, self.hostname or "")) % 1000

    def register_memory(self, buffer: Tensor) -> int:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError("register_memory takes a flat contiguous uint8 buffer")
        addr = buffer.data_ptr()
        self._regions[addr] = buffer
        return addr

    def unregister_memory(self, addr: int) -> int:
        return 0 if self._regions.pop(addr, None) is not None else -1

    def allocate_managed_buffer(self, length: int) -> int:
        buffer = torch.empty(length, dtype=torch.uint8)
        buffer.zero_()
        return self.register_memory(buffer)

    def free_managed_buffer(self, addr: int, length: int) -> int:
        return self.unregister_memory(addr)

    def _locate(self, addr: int, length: int) -> Tensor:
        for base, buffer in self._regions.items():
            if base <= addr and addr + length <= base + buffer.numel():
                return buffer[addr - base : addr - base + length]
        raise RuntimeError(f"{self.hostname}: [{addr:#x}, +{length}) is not registered memory")

    def write_bytes_to_buffer(self, addr: int, data: bytes, length: int) -> int:
        self._locate(addr, length).copy_(torch.frombuffer(bytearray(data[:length]), dtype=torch.uint8))
        return 0

    def read_bytes_from_buffer(self, addr: int, length: int) -> bytes:
        return self._locate(addr, length).numpy().tobytes()

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        peer = _CLUSTER.get(target_hostname)
        if peer is None:
            return -1
        peer._locate(peer_buffer_address, length).copy_(self._locate(buffer, length))
        return 0

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        peer = _CLUSTER.get(target_hostname)
        if peer is None:
            return -1
        self._locate(buffer, length).copy_(peer._locate(peer_buffer_address, length))
        return 0

    def typed_view(self, addr: int, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """A ``dtype`` tensor of ``shape`` over registered bytes at ``addr`` (no copy)."""
        nbytes = math.prod(shape) * element_size(dtype)
        return self._locate(addr, nbytes).view(dtype).view(tuple(shape))


def build_registered_segments() -> Dict[str, Tensor]:
    """A bf16 delta ring and a float32 log-decay ring laid out in one managed buffer, written to
    a peer's buffer and read back through typed views."""
    torch.manual_seed(0)
    src_engine, dst_engine = TransferEngine(), TransferEngine()
    src_engine.initialize("seg-prefill:17001", "P2PHANDSHAKE", "tcp", "")
    dst_engine.initialize("seg-decode:17101", "P2PHANDSHAKE", "tcp", "")
    src = src_engine.allocate_managed_buffer(4096)
    dst = dst_engine.allocate_managed_buffer(4096)
    src_engine.typed_view(src, (4, 4, 8), torch.bfloat16).copy_(torch.randn(4, 4, 8))
    src_engine.typed_view(src + 512, (4, 4, 8), torch.float32).copy_(-torch.rand(4, 4, 8))
    assert src_engine.transfer_sync_write("seg-decode:17101", src, dst, 1024) == 0
    back = torch.empty(1024, dtype=torch.uint8)
    back.zero_()
    scratch = src_engine.register_memory(back)
    src_engine.transfer_sync_read("seg-decode:17101", scratch, dst, 1024)
    return {
        "delta_ring": dst_engine.typed_view(dst, (4, 4, 8), torch.bfloat16).clone(),
        "forget_ring": dst_engine.typed_view(dst + 512, (4, 4, 8), torch.float32).clone(),
        "read_back": back,
    }
