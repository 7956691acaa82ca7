"""The decode cache object passed around as `past_key_values`."""

from typing import Optional

import torch

from .configuration_kimi_replay import KimiReplayConfig


class KimiReplayCache:
    """Per-layer checkpoint states and ReplaySSM rings, allocated up front for `max_batch_size`."""

    is_compileable = True

    def __init__(
        self,
        config: KimiReplayConfig,
        max_batch_size: int,
        dtype: Optional[torch.dtype] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        self.config = config
        self.max_batch_size = max_batch_size
        self.dtype = dtype if dtype is not None else config.model_dtype
        heads, value_heads = config.num_attention_heads, config.num_value_heads
        ring, dim = config.replay_ring_length, config.head_dim
        self.recurrent_states: list[torch.Tensor] = []
        self.d_cache: list[torch.Tensor] = []
        self.k_cache: list[torch.Tensor] = []
        self.g_cache: list[torch.Tensor] = []
        self.write_pos = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        for _ in range(config.num_hidden_layers):
            self.recurrent_states.append(
                torch.zeros(max_batch_size, value_heads, dim, dim, dtype=self.dtype, device=device)
            )
            self.d_cache.append(
                torch.zeros(max_batch_size, value_heads, ring, dim, dtype=self.dtype, device=device)
            )
            self.k_cache.append(
                torch.zeros(max_batch_size, heads, ring, dim, dtype=self.dtype, device=device)
            )
            self.g_cache.append(
                torch.zeros(max_batch_size, value_heads, ring, dim, dtype=self.dtype, device=device)  # expect-bug: container
            )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.write_pos.max())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for layer_idx in range(len(self.g_cache)):
            device = self.g_cache[layer_idx].device
            self.recurrent_states[layer_idx] = self.recurrent_states[layer_idx].index_select(
                0, beam_idx.to(device)
            )
            self.d_cache[layer_idx] = self.d_cache[layer_idx].index_select(0, beam_idx.to(device))
            self.k_cache[layer_idx] = self.k_cache[layer_idx].index_select(0, beam_idx.to(device))
            self.g_cache[layer_idx] = self.g_cache[layer_idx].index_select(0, beam_idx.to(device))

    def reset(self) -> None:
        for layer_idx in range(len(self.g_cache)):
            self.recurrent_states[layer_idx].zero_()
            self.d_cache[layer_idx].zero_()
            self.k_cache[layer_idx].zero_()
            self.g_cache[layer_idx] = self.d_cache[layer_idx].new_zeros(self.g_cache[layer_idx].shape)  # expect-bug: like
        self.write_pos.zero_()


class StaticReplayCache(KimiReplayCache):
    """The torch.compile-friendly variant: gate rings in float32, everything else in the model dtype."""

    def __init__(
        self,
        config: KimiReplayConfig,
        max_batch_size: int,
        dtype: Optional[torch.dtype] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__(config, max_batch_size, dtype, device)
        self.g_cache = [
            torch.zeros_like(layer_g, dtype=torch.float32) for layer_g in self.g_cache
        ]

    def reset(self) -> None:
        for layer_idx in range(len(self.g_cache)):
            self.recurrent_states[layer_idx].zero_()
            self.d_cache[layer_idx].zero_()
            self.k_cache[layer_idx].zero_()
            self.g_cache[layer_idx].zero_()
        self.write_pos.zero_()


def _cache_tensors(cache: KimiReplayCache) -> dict[str, object]:
    return {
        "recurrent_states": cache.recurrent_states,
        "d_cache": cache.d_cache,
        "k_cache": cache.k_cache,
        "g_cache": cache.g_cache,
        "write_pos": cache.write_pos,
    }


def build_dynamic_cache() -> dict[str, object]:
    return _cache_tensors(KimiReplayCache(KimiReplayConfig(), max_batch_size=2))


def build_dynamic_cache_after_reset() -> dict[str, object]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    KimiReplayCache.reset(cache)
    return _cache_tensors(cache)


def build_static_cache_reordered() -> dict[str, object]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    cache.reorder_cache(torch.tensor([1, 0]))
    cache.reset()
    return _cache_tensors(cache)
