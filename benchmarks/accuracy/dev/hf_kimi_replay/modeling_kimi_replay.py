"""KDA attention with ReplaySSM decode, transformers style (PreTrainedModel-like loading)."""

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import nn

from .cache_utils import KimiReplayCache
from .configuration_kimi_replay import KimiReplayConfig


def fused_recurrent_kda_replayssm_decode(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    out = kwargs.get("out", args[10] if len(args) > 10 else None)
    return out, kwargs.get("initial_state")


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KimiReplayConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_v_heads = config.num_value_heads
        self.head_dim = config.head_dim
        self.ring = config.replay_ring_length
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_v_heads, self.head_dim, dtype=torch.float32))
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        # Single-sequence decode keeps its own ring (no cache object needed).
        self.register_buffer(
            "replay_g_cache",
            torch.zeros(1, self.num_v_heads, self.ring, self.head_dim),  # expect-bug: default-dtype
            persistent=False,
        )
        self.register_buffer(
            "replay_d_cache", torch.zeros(1, self.num_v_heads, self.ring, self.head_dim), persistent=False
        )
        self.register_buffer(
            "replay_step", torch.zeros(1, dtype=torch.int32), persistent=False
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Optional[KimiReplayCache] = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = hidden_states.shape[0]
        out = hidden_states.new_zeros(batch, 1, self.num_v_heads, self.head_dim)
        if past_key_values is None:
            d_cache, g_cache = self.replay_d_cache, self.replay_g_cache
        else:
            d_cache = past_key_values.d_cache[self.layer_idx]
            g_cache = past_key_values.g_cache[self.layer_idx].type_as(hidden_states)  # expect-bug: cast
        fused_recurrent_kda_replayssm_decode(
            hidden_states,
            None,
            None,
            self.A_log,
            self.dt_bias,
            self.head_dim**-0.5,
            None,
            d_cache,
            None,
            g_cache,
            out,
        )
        return out, {"d_cache": d_cache, "g_cache": g_cache}


class KimiReplayModel(nn.Module):
    def __init__(self, config: KimiReplayConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            [KimiDeltaAttention(config, i) for i in range(config.num_hidden_layers)]
        )

    @classmethod
    def from_pretrained(cls, config: KimiReplayConfig, torch_dtype: Optional[torch.dtype] = None) -> "KimiReplayModel":
        dtype = torch_dtype if torch_dtype is not None else config.model_dtype
        with set_default_torch_dtype(dtype):
            model = cls(config)
        return model


class KimiReplayModelFp32Gates(KimiReplayModel):
    """Keeps every layer's gate ring float32 through `.to(dtype)`, `.half()` and loading."""

    def _apply(self, fn: Any, recurse: bool = True) -> "KimiReplayModelFp32Gates":
        super()._apply(fn, recurse)
        for layer in self.layers:
            assert isinstance(layer, KimiDeltaAttention)
            layer.replay_g_cache = layer.replay_g_cache.float()
        return self


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_buffers())


def build_from_pretrained_bf16() -> dict[str, torch.Tensor]:
    return _buffers(KimiReplayModel.from_pretrained(KimiReplayConfig()))


def build_eager_then_bf16() -> dict[str, torch.Tensor]:
    model = KimiReplayModel(KimiReplayConfig(torch_dtype="float32"))
    model = model.to(torch.bfloat16)  # expect-bug: module-cast
    return _buffers(model)


def build_fp32_gate_model_half() -> dict[str, torch.Tensor]:
    model = KimiReplayModelFp32Gates(KimiReplayConfig(torch_dtype="float32"))
    model.half()
    return _buffers(model)


def build_layer_forward_with_cache() -> dict[str, torch.Tensor]:
    config = KimiReplayConfig(torch_dtype="float32")
    layer = KimiDeltaAttention(config, 0)
    from .cache_utils import StaticReplayCache

    cache = StaticReplayCache(config, max_batch_size=2, dtype=torch.bfloat16)
    hidden = torch.randn(2, 1, config.hidden_size, dtype=torch.bfloat16)
    _, used = layer(hidden, past_key_values=cache)
    return used


def build_layer_forward_own_ring() -> dict[str, torch.Tensor]:
    layer = KimiDeltaAttention(KimiReplayConfig(torch_dtype="float32"), 0)
    hidden = torch.randn(1, 1, 16, dtype=torch.bfloat16)
    _, used = layer(hidden)
    return used
