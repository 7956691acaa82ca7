"""Model configuration (what `config.json` holds)."""

import torch


class KimiReplayConfig:
    model_type = "kimi_replay"

    def __init__(
        self,
        hidden_size: int = 16,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 1,
        num_value_heads: int = 2,
        head_dim: int = 4,
        replay_ring_length: int = 4,
        torch_dtype: str = "bfloat16",
        use_cache: bool = True,
        **kwargs: object,
    ) -> None:
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_value_heads = num_value_heads
        self.head_dim = head_dim
        self.replay_ring_length = replay_ring_length
        self.torch_dtype = torch_dtype
        self.use_cache = use_cache
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def model_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.torch_dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype
