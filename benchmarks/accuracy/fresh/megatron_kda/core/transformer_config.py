import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TransformerConfig:
    """Configuration object for the KDA hybrid model (a slice of megatron.core's)."""

    num_layers: int = 0
    hidden_size: int = 0
    padded_vocab_size: int = 32
    fp16: bool = False
    bf16: bool = False
    params_dtype: torch.dtype = torch.float32

    kda_num_heads: int = 2
    kda_num_k_heads: int = 1
    kda_head_dim: int = 4
    kda_gate_type: str = "softplus"
    kda_gate_logit_normalizer: float = 16.0

    replay_ring_len: int = 4
    replay_ring_dtype: torch.dtype = torch.float32
    replay_gate_dtype: torch.dtype = torch.float32
    static_replay_cache: bool = False

    def __post_init__(self) -> None:
        if self.fp16 and self.bf16:
            raise ValueError("Only one of self.fp16 and self.bf16 should be True.")
        if self.kda_gate_type not in ("softplus", "logsigmoid"):
            raise ValueError(f"unknown kda_gate_type {self.kda_gate_type}")


def core_transformer_config_from_args(
    args: Any, config_class: type[TransformerConfig] | None = None
) -> TransformerConfig:
    config_class = config_class or TransformerConfig
    kw_args = {}
    for f in dataclasses.fields(config_class):
        if hasattr(args, f.name):
            kw_args[f.name] = getattr(args, f.name)
    return config_class(**kw_args)
