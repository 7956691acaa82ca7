"""`MoonKdaCache`, the `past_key_values` of the model: states and replay rings per layer."""

from typing import Optional

import torch

from .configuration_moonkda import MoonKdaConfig


class MoonKdaCache:
    def __init__(self, config: MoonKdaConfig, batch_size: int, device: Optional[torch.device] = None) -> None:
        self.config = config
        self.batch_size = batch_size
        layers = range(config.num_hidden_layers)
        v_shape = (batch_size, config.num_value_heads, config.replay_window, config.head_dim)
        k_shape = (batch_size, config.num_key_heads, config.replay_window, config.head_dim)
        s_shape = (batch_size, config.num_value_heads, config.head_dim, config.head_dim)
        self.ssm_states = [torch.zeros(s_shape, dtype=config.torch_dtype, device=device) for _ in layers]
        self.value_ring = [torch.zeros(v_shape, dtype=config.torch_dtype, device=device) for _ in layers]
        self.key_ring = [torch.zeros(k_shape, dtype=config.torch_dtype, device=device) for _ in layers]
        self.gate_cache = list(torch.zeros(v_shape, dtype=config.torch_dtype, device=device) for _ in layers)  # expect-bug: container
        self.cursor = torch.zeros(batch_size, dtype=torch.int32, device=device)

    def crop(self, max_length: int) -> None:
        """Drops the ring rows past `max_length` (assisted generation rejected them)."""
        for idx in range(len(self.gate_cache)):
            self.value_ring[idx][:, :, max_length:] = 0
            self.key_ring[idx][:, :, max_length:] = 0
            self.gate_cache[idx][:, :, max_length:] = 0
        self.cursor.clamp_(max=max_length)

    def reset(self) -> None:
        for idx in range(len(self.gate_cache)):
            self.ssm_states[idx].zero_()
            self.value_ring[idx].zero_()
            self.key_ring[idx].zero_()
            self.gate_cache[idx] = torch.zeros_like(self.value_ring[idx])  # expect-bug: like
        self.cursor.zero_()

    def batch_repeat_interleave(self, repeats: int) -> None:
        for idx in range(len(self.gate_cache)):
            self.ssm_states[idx] = self.ssm_states[idx].repeat_interleave(repeats, dim=0)
            self.value_ring[idx] = self.value_ring[idx].repeat_interleave(repeats, dim=0)
            self.key_ring[idx] = self.key_ring[idx].repeat_interleave(repeats, dim=0)
            self.gate_cache[idx] = self.gate_cache[idx].repeat_interleave(repeats, dim=0)
        self.cursor = self.cursor.repeat_interleave(repeats, dim=0)


class MoonKdaFp32GateCache(MoonKdaCache):
    def __init__(self, config: MoonKdaConfig, batch_size: int, device: Optional[torch.device] = None) -> None:
        super().__init__(config, batch_size, device)
        self.gate_cache = [gate.float() for gate in self.gate_cache]

    def reset(self) -> None:
        for idx in range(len(self.gate_cache)):
            self.ssm_states[idx].zero_()
            self.value_ring[idx].zero_()
            self.key_ring[idx].zero_()
            self.gate_cache[idx] = torch.zeros_like(self.value_ring[idx], dtype=torch.float32)
        self.cursor.zero_()


def _tensors(cache: MoonKdaCache) -> dict[str, object]:
    return {
        "ssm_states": cache.ssm_states,
        "value_ring": cache.value_ring,
        "key_ring": cache.key_ring,
        "gate_cache": cache.gate_cache,
        "cursor": cache.cursor,
    }


def build_cache() -> dict[str, object]:
    return _tensors(MoonKdaCache(MoonKdaConfig(), 2))


def build_fp32_cache_base_reset() -> dict[str, object]:
    cache = MoonKdaFp32GateCache(MoonKdaConfig(), 2)
    MoonKdaCache.reset(cache)
    return _tensors(cache)


def build_fp32_cache_cropped_and_repeated() -> dict[str, object]:
    cache = MoonKdaFp32GateCache(MoonKdaConfig(), 2)
    cache.crop(2)
    cache.batch_repeat_interleave(2)
    cache.reset()
    return _tensors(cache)
