"""Configuration of the model (the fields config.json carries)."""

from dataclasses import dataclass

import torch


@dataclass
class MoonKdaConfig:
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_key_heads: int = 1
    num_value_heads: int = 2
    head_dim: int = 4
    replay_window: int = 4
    torch_dtype: torch.dtype = torch.bfloat16
    use_cache: bool = True
