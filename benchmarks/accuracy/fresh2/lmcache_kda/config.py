import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .utils import ReplayChunkLayout


@dataclass
class LMCacheEngineMetadata:
    """name of the LLM model"""

    model_name: str
    """ world size when running under a distributed setting """
    world_size: int
    """ worker id when running under a distributed setting """
    worker_id: int
    """ the format of the cache, "vllm" """
    fmt: str
    """ the data type of the d/k rings (the KV cache dtype of the serving engine) """
    kv_dtype: torch.dtype
    """ (num_layers, num_heads, num_v_heads, ring_len, head_k_dim, head_v_dim) of the KDA layers """
    kv_shape: tuple[int, int, int, int, int, int]
    """ the data type of staged log-gate rings: log-decays are bounded by lower_bound, half precision holds them """
    gate_dtype: torch.dtype = torch.float16  # expect-bug: container id=meta-gate-dtype

    @property
    def layout(self) -> ReplayChunkLayout:
        return ReplayChunkLayout(*self.kv_shape)


@dataclass
class LMCacheEngineConfig:
    chunk_size: int
    local_cpu: bool
    max_local_cpu_size: float  # in GB
    local_disk: Optional[str]
    remote_url: Optional[str]
    remote_serde: Optional[str]  # Can be "naive", "fast" or "compact"
    pinned_cpu_pool: bool = False
    save_decode_cache: bool = False
    save_unfull_chunk: bool = False
    save_in_kv_dtype: bool = False
    # layout string of the log-gate ring, for connectors that pack it themselves
    gate_ring_layout: str = "HLK"
    extra_config: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_dict(config: dict[str, Any]) -> "LMCacheEngineConfig":
        """Builds the config from a parsed LMCache yaml file."""
        local_disk = config.get("local_disk")
        if local_disk is not None and not (match := re.match(r"file://(.*)/?", local_disk)):
            raise ValueError(f"local_disk must start with file://, got {local_disk}")
        return LMCacheEngineConfig(
            chunk_size=int(config.get("chunk_size", 256)),
            local_cpu=bool(config.get("local_cpu", True)),
            max_local_cpu_size=float(config.get("max_local_cpu_size", 5.0)),
            local_disk=None if local_disk is None else match.group(1),
            remote_url=config.get("remote_url"),
            remote_serde=config.get("remote_serde", "naive"),
            pinned_cpu_pool=bool(config.get("pinned_cpu_pool", False)),
            save_decode_cache=bool(config.get("save_decode_cache", False)),
            save_unfull_chunk=bool(config.get("save_unfull_chunk", False)),
            save_in_kv_dtype=bool(config.get("save_in_kv_dtype", False)),
            gate_ring_layout=str(config.get("gate_ring_layout", "HLK")),
            extra_config=dict(config.get("extra_config") or {}),
        )
