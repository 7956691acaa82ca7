"""``params.json`` of the KDA hybrid Llama and the dtype names of the export flags."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Tuple

import torch

# The replay op sums log-decays along the ring: that ring is always fp32.
LOG_GATE_DTYPE = torch.float32


class DType(Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"

    def to_torch_dtype(self) -> torch.dtype:
        mapping = {DType.fp32: torch.float32, DType.fp16: torch.float16, DType.bf16: torch.bfloat16}
        return mapping[self]


@dataclass
class ModelArgs:
    dim: int = 16
    n_layers: int = 2
    n_heads: int = 2  # key heads of a KDA layer
    n_v_heads: int = 2
    head_dim: int = 4
    hidden_dim: int = 32
    vocab_size: int = 32
    norm_eps: float = 1e-5
    max_batch_size: int = 2  # decode slots of the static cache
    max_seq_len: int = 16
    replay_len: int = 4  # steps kept in each ring before the checkpoint state is flushed
    use_kv_cache: bool = True
    use_custom_replay_op: bool = False  # llama::replayssm_decode instead of the portable path
    quantize_kv_cache: bool = False
    dtype_override: Optional[str] = None  # "fp32" | "fp16" | "bf16"
    cache_dtype: Optional[str] = None  # rings of an exported method; None: as the activations
    layer_types: List[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = ["kda"] * self.n_layers

    def ring_shapes(self, replay_len: Optional[int] = None) -> Dict[str, Tuple[int, ...]]:
        B, L, D = self.max_batch_size, replay_len or self.replay_len, self.head_dim
        return {
            "d_cache": (B, self.n_v_heads, L, D),
            "k_cache": (B, self.n_heads, L, D),
            "log_gate_cache": (B, self.n_v_heads, L, D),
        }

    def ring_dtypes(self) -> Dict[str, torch.dtype]:
        """dtype of every ring of the cache of an exported method (``--cache_dtype``)."""
        cache = DType(self.cache_dtype or self.dtype_override or "fp32").to_torch_dtype()
        return dict.fromkeys(self.ring_shapes(), cache)  # expect-bug: imported-policy id=ring-dtypes
