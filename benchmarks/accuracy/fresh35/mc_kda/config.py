"""Settings of the transfer layer.

Like the Mooncake integrations, a deployment is described by a JSON file whose path is in
``MOONCAKE_CONFIG_PATH``; a few environment variables override single fields so that a launcher
can change them per worker without writing a new file:

* ``MOONCAKE_LOCAL_HOSTNAME``, ``MOONCAKE_PROTOCOL``;
* ``KV_TRANSFER_DTYPE``: dtype of the delta/key rings (``bfloat16`` unless set);
* ``KV_TRANSFER_DECAY_DTYPE``: dtype of the log-decay rings.
"""

import contextlib
import dataclasses
import json
import os
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

CONFIG_PATH_ENV = "MOONCAKE_CONFIG_PATH"

STR_DTYPE_TO_TORCH: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
TORCH_DTYPE_TO_STR: Dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.uint8: "uint8",
}


def str_to_torch_dtype(name: str) -> torch.dtype:
    try:
        return STR_DTYPE_TO_TORCH[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


def torch_dtype_to_str(dtype: torch.dtype) -> str:
    return TORCH_DTYPE_TO_STR[dtype]


@dataclasses.dataclass(frozen=True)
class KDAShapes:
    """Head layout of one KDA layer and the ring length of its cache slots."""

    num_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 8
    head_v_dim: int = 8
    ring_len: int = 4
    hidden_size: int = 16
    vocab_size: int = 32

    @property
    def state(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def delta(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.ring_len, self.head_v_dim)

    @property
    def key(self) -> Tuple[int, int, int]:
        return (self.num_heads, self.ring_len, self.head_k_dim)

    @property
    def forget(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.ring_len, self.head_k_dim)


@dataclasses.dataclass(frozen=True)
class RingDtypes:
    """Dtypes of a layer's rings; the checkpoint state is always float32."""

    delta: torch.dtype
    key: torch.dtype
    forget: torch.dtype = torch.float32

    @classmethod
    def for_model(cls, dtype: torch.dtype) -> "RingDtypes":
        return cls(delta=dtype, key=dtype)


# ``--precision-profile``: cache and wire dtypes of the delta, key and log-decay rings.
PRECISION_PROFILES: Dict[str, RingDtypes] = {
    "fp32": RingDtypes(torch.float32, torch.float32),
    "bf16": RingDtypes(torch.bfloat16, torch.bfloat16),
    "fp16": RingDtypes(torch.float16, torch.float16, torch.float32),
    "bf16-compact": RingDtypes(torch.bfloat16, torch.bfloat16, torch.bfloat16),  # expect-bug: imported-policy id=wire-profile
}


@dataclasses.dataclass
class MooncakeTransferConfig:
    local_hostname: str = "localhost"
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""
    master_server_address: str = "localhost:50051"
    global_segment_size: int = 1 << 20
    local_buffer_size: int = 1 << 16
    kv_role: str = "kv_both"
    transfer_dtype: str = "bfloat16"
    decay_dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    num_slots: int = 3
    ring_len: int = 4

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "MooncakeTransferConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})

    @classmethod
    def from_file(cls, path: str) -> "MooncakeTransferConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def load_from_env(cls) -> "MooncakeTransferConfig":
        path = os.environ.get(CONFIG_PATH_ENV)
        base = cls.from_file(path) if path else cls()
        transfer_dtype = os.environ.get("KV_TRANSFER_DTYPE", base.transfer_dtype)
        decay_dtype = os.environ.get("KV_TRANSFER_DECAY_DTYPE", transfer_dtype)  # expect-bug: imported-policy id=env-decay
        return dataclasses.replace(
            base,
            local_hostname=os.environ.get("MOONCAKE_LOCAL_HOSTNAME", base.local_hostname),
            protocol=os.environ.get("MOONCAKE_PROTOCOL", base.protocol),
            transfer_dtype=transfer_dtype,
            decay_dtype=decay_dtype,
        )

    @property
    def ring_dtype(self) -> torch.dtype:
        return str_to_torch_dtype(self.transfer_dtype)

    @property
    def decay_torch_dtype(self) -> torch.dtype:
        return str_to_torch_dtype(self.decay_dtype)

    def ring_dtypes(self) -> RingDtypes:
        return RingDtypes(self.ring_dtype, self.ring_dtype, self.decay_torch_dtype)

    def to_file(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
        return path


@contextlib.contextmanager
def scoped_env(**values: Optional[str]) -> Iterator[None]:
    """Sets (or, for ``None``, unsets) environment variables for the duration of the block."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
