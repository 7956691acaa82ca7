import hashlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch


def _lmcache_nvtx_annotate(func):
    """Decorator marking a function for nvtx profiling (a no-op without CUDA)."""
    return torch.cuda.nvtx.range(func.__qualname__)(func) if torch.cuda.is_available() else func


STR_DTYPE_TO_TORCH_DTYPE = {
    "half": torch.half, "float16": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float,
    "float32": torch.float32, "fp8": torch.uint8,
}
TORCH_DTYPE_TO_STR_DTYPE = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.uint8: "fp8"}


def get_kv_cache_torch_dtype(cache_dtype: str, model_dtype: str) -> torch.dtype:
    """The KV cache dtype of a vLLM instance (`cache_config.cache_dtype`, "auto" follows the model)."""
    return STR_DTYPE_TO_TORCH_DTYPE[model_dtype if cache_dtype == "auto" else cache_dtype]


@dataclass(frozen=True)
class CacheEngineKey:
    fmt: str
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: str

    def to_string(self) -> str:
        return f"{self.fmt}@{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash}"


def prefix_hash(prefix_hash_: str, token_ids: list[int]) -> str:
    """Hash of a token chunk chained with the hash of everything before it."""
    hasher = hashlib.sha256(prefix_hash_.encode())
    hasher.update(",".join(map(str, token_ids)).encode())
    return hasher.hexdigest()[:32]


TENSOR_FIELDS = ("ssm_state", "d_ring", "k_ring", "log_gate_ring")


class ReplayStateChunk(NamedTuple):
    """ReplaySSM state of one request at a chunk boundary, every KDA layer stacked on dim 0: checkpoint state
    `[n, HV, V, K]`, delta / key rings `[n, HV|H, L, V|K]`, ring of per-step log-decays `[n, HV, L, K]`, cursor."""

    ssm_state: torch.Tensor
    d_ring: torch.Tensor
    k_ring: torch.Tensor
    log_gate_ring: torch.Tensor
    write_pos: int

    @property
    def ring_dtype(self) -> torch.dtype:
        """dtype of the chunk's replay rings."""
        return self.d_ring.dtype  # expect-bug: container id=ring-dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f: getattr(self, f) for f in TENSOR_FIELDS}

    def cast_rings(self, dtype: torch.dtype) -> "ReplayStateChunk":
        """The chunk with its replay rings in `dtype`; the checkpoint state stays float32."""
        return self._replace(d_ring=self.d_ring.to(dtype), k_ring=self.k_ring.to(dtype), log_gate_ring=self.log_gate_ring.to(dtype))  # expect-bug: cast id=save-kv-dtype


class ReplayChunkLayout(NamedTuple):
    num_layers: int
    num_heads: int
    num_v_heads: int
    ring_len: int
    head_k_dim: int
    head_v_dim: int

    def field_shapes(self) -> dict[str, tuple[int, ...]]:
        n, H, HV, L, K, V = self
        return {"ssm_state": (n, HV, V, K), "d_ring": (n, HV, L, V), "k_ring": (n, H, L, K), "log_gate_ring": (n, HV, L, K)}


# element type of each chunk field; "kv" is the engine's kv_dtype
REPLAY_FIELD_DTYPES = {"ssm_state": "float32", "d_ring": "kv", "k_ring": "kv", "log_gate_ring": "kv"}  # expect-bug: imported-policy id=field-layout


def chunk_field_layout(layout: ReplayChunkLayout, kv_dtype: torch.dtype, alignment: int = 64):
    """`(field, shape, dtype, offset, nbytes)` of each field of a chunk packed into one byte page, and the page size."""
    fields, offset = [], 0
    for field, shape in layout.field_shapes().items():
        name = REPLAY_FIELD_DTYPES[field]
        dtype = kv_dtype if name == "kv" else STR_DTYPE_TO_TORCH_DTYPE[name]
        nbytes = math.prod(shape) * dtype.itemsize
        fields.append((field, shape, dtype, offset, nbytes))
        offset += -(-nbytes // alignment) * alignment
    return fields, offset
