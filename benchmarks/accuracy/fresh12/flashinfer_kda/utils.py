"""Helpers shared by the wrappers: dtype canonicalisation, cached scratch buffers, argument checks."""

import contextlib
import dataclasses
import enum
from typing import Dict, Iterator, Optional, Tuple, Union

import torch


class TensorLayout(enum.Enum):
    """Layout of the checkpoint state: ``VK`` is ``[slots, HV, V, K]`` (the kernel's), ``KV`` the transpose."""

    VK = 0
    KV = 1


_STR_TO_DTYPE: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "int32": torch.int32,
    "uint8": torch.uint8,
}

filename_safe_dtype_map: Dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.uint8: "u8",
}


def canonicalize_torch_dtype(dtype: Union[torch.dtype, str]) -> torch.dtype:
    """``torch.bfloat16`` for ``"bf16"``, ``"bfloat16"`` or ``torch.bfloat16``."""
    if isinstance(dtype, str):
        try:
            return _STR_TO_DTYPE[dtype]
        except KeyError:
            raise ValueError(f"Unsupported data type string: {dtype!r}") from None
    if isinstance(dtype, torch.dtype):
        return dtype
    raise TypeError(f"dtype must be a string or torch.dtype, got {type(dtype)}")


_cache_buf: Dict[Tuple[str, torch.device], torch.Tensor] = {}


def _get_cache_buf(name: str, bytes: int, device: torch.device) -> torch.Tensor:
    """A zeroed uint8 scratch buffer of at least ``bytes`` bytes, shared by every caller of ``name``."""
    device = torch.device(device)
    key = (name, device)
    buf = _cache_buf.get(key)
    if buf is None or buf.numel() < bytes:
        buf = torch.zeros(bytes, dtype=torch.uint8, device=device)
        _cache_buf[key] = buf
    return buf


def _check_shape_dtype_device(
    x: torch.Tensor,
    expected_shape: Optional[Tuple[int, ...]],
    expected_dtype: Optional[torch.dtype],
    expected_device: Optional[torch.device],
    name: str,
) -> None:
    if expected_shape is not None and tuple(x.shape) != tuple(expected_shape):
        raise ValueError(f"Invalid shape of {name}: expected {tuple(expected_shape)}, got {tuple(x.shape)}")
    if expected_dtype is not None and x.dtype != expected_dtype:
        raise ValueError(f"Invalid dtype of {name}: expected {expected_dtype}, got {x.dtype}")
    if expected_device is not None and x.device != torch.device(expected_device):
        raise ValueError(f"Invalid device of {name}: expected {expected_device}, got {x.device}")


def _unpack_paged_ring_cache(
    paged_ring_cache: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ring_layout: str = "VK",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(state, delta, key, log_decay)`` from the tuple form of a paged ring cache.

    A ``KV`` state is handed to the kernel as a transposed view.
    """
    if not isinstance(paged_ring_cache, (tuple, list)) or len(paged_ring_cache) != 4:
        raise TypeError("paged_ring_cache must be a tuple (state, delta, key, log_decay)")
    state, delta, key, log_decay = paged_ring_cache
    if TensorLayout[ring_layout] == TensorLayout.KV:
        state = state.transpose(-1, -2)
    return state, delta, key, log_decay


@contextlib.contextmanager
def set_default_torch_dtype(dtype: Union[torch.dtype, str]) -> Iterator[None]:
    """Sets torch's default dtype for the block and restores the previous one on exit."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(canonicalize_torch_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def get_state_data_type(kv_data_type: Union[torch.dtype, str]) -> torch.dtype:
    """Storage dtype of the checkpoint state: the kv data type."""
    return canonicalize_torch_dtype(kv_data_type)


def get_index_data_type() -> torch.dtype:
    """Slot tables, page tables and cursors are int32, as the kernels index with 32-bit offsets."""
    return torch.int32


def determine_ring_data_types(
    q_data_type: Union[torch.dtype, str],
    kv_data_type: Optional[Union[torch.dtype, str]] = None,
    state_data_type: Optional[Union[torch.dtype, str]] = None,
) -> Tuple[torch.dtype, torch.dtype, torch.dtype, torch.dtype]:
    """Storage dtypes ``(state, delta, key, log_decay)``; kv defaults to q and the state to kv."""
    q = canonicalize_torch_dtype(q_data_type)
    kv = canonicalize_torch_dtype(kv_data_type) if kv_data_type is not None else q
    state = canonicalize_torch_dtype(state_data_type) if state_data_type is not None else kv
    return state, kv, kv, kv  # expect-bug: imported-policy id=ring-policy


@dataclasses.dataclass(frozen=True)
class ReplayRingConfig:
    """Geometry and storage of the ReplaySSM rings of one KDA layer (local heads)."""

    num_qk_heads: int
    num_v_heads: int
    head_dim_k: int
    head_dim_v: int
    ring_len: int = 16
    kv_data_type: Union[str, torch.dtype] = "bfloat16"
    lower_bound: Optional[float] = None

    @property
    def state_data_type(self) -> torch.dtype:
        return get_state_data_type(self.kv_data_type)

    @property
    def ring_data_type(self) -> torch.dtype:
        """Storage dtype of the d and k rings."""
        return canonicalize_torch_dtype(self.kv_data_type)

    @property
    def log_decay_data_type(self) -> torch.dtype:
        """Storage dtype of the log-decay ring."""
        return canonicalize_torch_dtype(self.kv_data_type)  # expect-bug: imported-policy id=ring-config

    @property
    def cursor_data_type(self) -> torch.dtype:
        return get_index_data_type()

    def ring_shapes(self, num_slots: int) -> Dict[str, Tuple[int, ...]]:
        H, HV, K, V, L = self.num_qk_heads, self.num_v_heads, self.head_dim_k, self.head_dim_v, self.ring_len
        return {
            "ssm_state": (num_slots, HV, V, K),
            "delta_buf": (num_slots, HV, L, V),
            "key_buf": (num_slots, H, L, K),
            "log_decay_buf": (num_slots, HV, L, K),
        }
