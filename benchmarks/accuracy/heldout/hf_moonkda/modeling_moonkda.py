"""MoonKda attention layer and model; `from_pretrained` builds it in the checkpoint dtype."""

from typing import Any, Optional

import torch
from torch import nn

from .cache_utils import MoonKdaCache
from .configuration_moonkda import MoonKdaConfig

USED: dict[str, torch.Tensor] = {}


def chunk_kda_replayssm_decode(*args: Any, **kwargs: Any) -> Any:
    USED.clear()
    USED.update({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    return kwargs["out"]


class MoonKdaAttention(nn.Module):
    def __init__(self, config: MoonKdaConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        hv, dim, window = config.num_value_heads, config.head_dim, config.replay_window
        self.A_log = nn.Parameter(torch.zeros(hv, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(hv, dim, dtype=torch.float32))
        self.o_proj = nn.Linear(hv * dim, config.hidden_size, bias=False)
        # Batch-1 generation without a cache object uses these buffers.
        self.register_buffer("local_value_ring", torch.empty(1, hv, window, dim).zero_(), persistent=False)
        self.register_buffer("local_gate_cache", torch.empty(1, hv, window, dim).zero_(), persistent=False)  # expect-bug: default-dtype

    def forward(self, hidden_states: torch.Tensor, past_key_values: Optional[MoonKdaCache] = None,
                **kwargs: Any) -> torch.Tensor:
        batch = hidden_states.shape[0]
        out = hidden_states.new_zeros(batch, 1, self.config.num_value_heads, self.config.head_dim)
        if past_key_values is not None:
            value_ring = past_key_values.value_ring[self.layer_idx]
            gate_cache = past_key_values.gate_cache[self.layer_idx].to(hidden_states)  # expect-bug: cast
        else:
            value_ring, gate_cache = self.local_value_ring, self.local_gate_cache
        chunk_kda_replayssm_decode(
            mixed_qkv=hidden_states, A_log=self.A_log, dt_bias=self.dt_bias,
            d_cache=value_ring, g_cache=gate_cache, out=out,
        )
        return out


class MoonKdaModel(nn.Module):
    _keep_in_fp32_buffers = ("local_gate_cache",)

    def __init__(self, config: MoonKdaConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([MoonKdaAttention(config, i) for i in range(config.num_hidden_layers)])

    @classmethod
    def from_pretrained(cls, config: MoonKdaConfig) -> "MoonKdaModel":
        previous = torch.get_default_dtype()
        torch.set_default_dtype(config.torch_dtype)
        model = cls(config)
        torch.set_default_dtype(previous)
        return model

    def keep_fp32_buffers(self) -> "MoonKdaModel":
        for module in self.modules():
            for name in self._keep_in_fp32_buffers:
                if isinstance(module, MoonKdaAttention):
                    setattr(module, name, getattr(module, name).to(torch.float32))
        return self


def build_from_pretrained() -> dict[str, torch.Tensor]:
    return dict(MoonKdaModel.from_pretrained(MoonKdaConfig()).named_buffers())


def build_from_pretrained_keep_fp32() -> dict[str, torch.Tensor]:
    return dict(MoonKdaModel.from_pretrained(MoonKdaConfig()).keep_fp32_buffers().named_buffers())


def build_bf16_after_init() -> dict[str, torch.Tensor]:
    model = MoonKdaModel(MoonKdaConfig(torch_dtype=torch.float32))
    model.bfloat16()  # expect-bug: module-cast
    return dict(model.named_buffers())


def build_bf16_after_init_keep_fp32() -> dict[str, torch.Tensor]:
    model = MoonKdaModel(MoonKdaConfig(torch_dtype=torch.float32))
    model = model.bfloat16().keep_fp32_buffers()
    return dict(model.named_buffers())


def build_forward_with_fp32_cache() -> dict[str, torch.Tensor]:
    from .cache_utils import MoonKdaFp32GateCache

    config = MoonKdaConfig()
    layer = MoonKdaAttention(MoonKdaConfig(torch_dtype=torch.float32), 1)
    layer(torch.randn(2, 1, 16).bfloat16(), past_key_values=MoonKdaFp32GateCache(config, 2))
    return dict(USED)


def build_forward_local_buffers() -> dict[str, torch.Tensor]:
    layer = MoonKdaAttention(MoonKdaConfig(torch_dtype=torch.float32), 0)
    layer(torch.randn(1, 1, 16).bfloat16())
    return dict(USED)
