"""The KDA mixer module of the PyTorch backend: decode through the cache manager's rings."""

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from .kv_cache_config import KvCacheConfig
from .mamba_cache_manager import (
    MambaCacheManager,
    ReplayRings,
    create_mamba_cache_manager_fp32_gates,
)

RECORDED: dict[str, torch.Tensor] = {}


def kda_replayssm_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
    dt_bias: torch.Tensor, scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor,
    k_cache: torch.Tensor, g_cache: torch.Tensor, out: torch.Tensor,
    ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    RECORDED.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    return out.zero_()


@dataclass
class AttentionMetadata:
    request_ids: list[int]
    kv_cache_manager: MambaCacheManager
    force_flush: Optional[torch.Tensor] = None
    extra: dict[str, Any] = field(default_factory=dict)


class KDAMixer(nn.Module):
    def __init__(self, layer_idx: int, num_heads: int = 1, num_value_heads: int = 2, head_dim: int = 4,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_value_heads, self.head_dim = num_heads, num_value_heads, head_dim
        self.dtype = dtype
        self.A_log = nn.Parameter(torch.zeros(num_value_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(num_value_heads, head_dim, dtype=torch.float32))

    def forward(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        manager = attn_metadata.kv_cache_manager
        rings = manager.get_replay_rings(self.layer_idx)
        state_indices = manager.get_state_indices(attn_metadata.request_ids)
        out = torch.empty(mixed_qkv.shape[0], 1, self.num_value_heads, self.head_dim, dtype=self.dtype)
        kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.head_dim**-0.5,
            manager.get_ssm_states(self.layer_idx), rings.d, rings.k, rings.g, out,
            state_indices, manager.write_pos[state_indices.long()],
            force_flush=attn_metadata.force_flush,
        )
        return out

    def forward_speculative(self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                            attn_metadata: AttentionMetadata) -> torch.Tensor:
        # Draft tokens run on scratch rings, so a rejected draft leaves the real ones untouched.
        manager = attn_metadata.kv_cache_manager
        rings = manager.get_replay_rings(self.layer_idx)
        scratch = ReplayRings(rings.d.clone(), rings.k.clone(), torch.empty_like(rings.d).copy_(rings.g))  # expect-bug: decode-arg
        state_indices = manager.get_state_indices(attn_metadata.request_ids)
        out = torch.empty(mixed_qkv.shape[0], 1, self.num_value_heads, self.head_dim, dtype=self.dtype)
        kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.head_dim**-0.5,
            manager.get_ssm_states(self.layer_idx).clone(), scratch.d, scratch.k, scratch.g, out,
            state_indices, manager.write_pos[state_indices.long()],
        )
        return out


def receive_gate_ring(payload: bytes, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Disaggregated serving: the context server sends each ring as raw bytes."""
    g_cache = torch.from_numpy(np.frombuffer(payload, dtype=np.float32).copy()).view(shape)
    return g_cache.to(dtype)  # expect-bug: cast id=trt-receive


def receive_gate_ring_fp32(payload: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    g_cache = torch.from_numpy(np.frombuffer(payload, dtype=np.float32).copy()).view(shape)
    return g_cache


def load_gate_ring_dump(path: str, shape: tuple[int, ...], model_dtype: torch.dtype) -> torch.Tensor:
    """Reads a ring dump written by the engine's state exporter (raw little-endian, model dtype)."""
    np_dtype = np.float16 if model_dtype == torch.float16 else np.float32
    raw = np.memmap(path, dtype=np_dtype, mode="r", shape=shape)
    g_cache = torch.from_numpy(np.array(raw))  # expect-bug: load
    return g_cache


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (
        torch.randn(batch, 16, dtype=torch.bfloat16),
        torch.randn(batch, 2, 4, dtype=torch.bfloat16),
        torch.randn(batch, 2, dtype=torch.bfloat16),
    )


def _metadata() -> AttentionMetadata:
    manager = create_mamba_cache_manager_fp32_gates(KvCacheConfig(), torch.bfloat16)
    manager.reset()
    manager.prepare_resources([1, 2])
    return AttentionMetadata(request_ids=[1, 2], kv_cache_manager=manager)


def build_mixer_decode() -> dict[str, torch.Tensor]:
    KDAMixer(0)(*_inputs(2), attn_metadata=_metadata())
    return dict(RECORDED)


def build_mixer_speculative() -> dict[str, torch.Tensor]:
    KDAMixer(1).forward_speculative(*_inputs(2), attn_metadata=_metadata())
    return dict(RECORDED)


def _payload() -> bytes:
    return np.linspace(-2.0, 0.0, 32, dtype=np.float32).tobytes()


def build_receive_ring_bf16() -> dict[str, torch.Tensor]:
    return {"g_cache": receive_gate_ring(_payload(), (1, 2, 4, 4), torch.bfloat16)}  # expect-bug: cast id=trt-receive


def build_receive_ring_fp32() -> dict[str, torch.Tensor]:
    return {"g_cache": receive_gate_ring_fp32(_payload(), (1, 2, 4, 4))}


def build_load_dump_fp16(tmp_dir: str) -> dict[str, torch.Tensor]:
    path = f"{tmp_dir}/g_ring.bin"
    np.linspace(-1.0, 0.0, 32, dtype=np.float16).tofile(path)
    return {"g_cache": load_gate_ring_dump(path, (1, 2, 4, 4), torch.float16)}
