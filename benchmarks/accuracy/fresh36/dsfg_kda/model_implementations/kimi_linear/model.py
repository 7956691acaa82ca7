"""Kimi Linear (KDA layers only) as a ragged inference model."""

import dataclasses
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor, nn

from ...config_v2 import RING_POLICIES, RaggedInferenceEngineConfig, RingDtypes, SSMCacheConfig
from ...modules import DSKDAAttention, DSKDAConfig, KDARingBuffers, ModuleRingCache
from ...ragged import LayerRings, RaggedBatchWrapper
from ...ragged.ssm_cache import SlotAccessMixin


@dataclasses.dataclass
class KimiLinearConfig:
    """The fields of a Kimi Linear ``config.json`` that the engine reads."""

    model_type: ClassVar[str] = "kimi_linear"
    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 8
    head_v_dim: int = 8
    ring_len: int = 4
    torch_dtype: str = "bfloat16"


class KimiLinearInferenceModel(nn.Module):
    def __init__(
        self,
        config: KimiLinearConfig,
        engine_config: RaggedInferenceEngineConfig,
        dtype: torch.dtype,
        ring_buffer_cls: Type[KDARingBuffers] = KDARingBuffers,
    ) -> None:
        super().__init__()
        self._config = config
        self._engine_config = engine_config
        self._attn_config = DSKDAConfig(
            hidden_size=config.hidden_size,
            num_heads=config.num_heads,
            num_v_heads=config.num_v_heads,
            head_k_dim=config.head_k_dim,
            head_v_dim=config.head_v_dim,
            ring_len=config.ring_len,
            dtype=dtype,
        )
        if not DSKDAAttention.supports_config(self._attn_config):
            raise ValueError(f"unsupported KDA head layout: {self._attn_config}")
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DSKDAAttention(self._attn_config) for _ in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)
        self.ring_buffers: Optional[nn.ModuleList] = None
        if engine_config.compact_slots:
            self.ring_buffers = nn.ModuleList(
                ring_buffer_cls(self._attn_config, engine_config.compact_slots) for _ in self.layers
            )
        self.requires_grad_(False)

    @property
    def model_dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def config(self) -> KimiLinearConfig:
        return self._config

    def ring_dtypes(self) -> RingDtypes:
        state_manager = self._engine_config.state_manager
        policy = state_manager.memory_config.ring_policy
        if policy != "default":
            return RING_POLICIES[policy](self.model_dtype)
        cache = state_manager.cache_dtype.value if state_manager.cache_dtype is not None else self.model_dtype
        return RingDtypes(cache=cache, decay=state_manager.decay_dtype.value)

    def ssm_cache_config(self) -> Tuple[SSMCacheConfig, ...]:
        """One cache config per KDA layer (the ``kv_cache_config`` of the attention models)."""
        a, dtypes = self._attn_config, self.ring_dtypes()
        state_manager = self._engine_config.state_manager
        num_slots = self._engine_config.compact_slots or state_manager.max_tracked_sequences
        return tuple(
            SSMCacheConfig(
                num_slots=num_slots,
                state_shape=a.state_shape,
                delta_shape=a.delta_shape,
                key_shape=a.key_shape,
                decay_shape=a.decay_shape,
                cache_dtype=dtypes.cache,
                decay_dtype=dtypes.decay,
                allocation_mode=state_manager.memory_config.allocation_mode,
            )
            for _ in self.layers
        )

    def ssm_cache(self) -> Optional[ModuleRingCache]:
        """The in-model cache of a compact deployment; ``None``: the state manager allocates one."""
        return ModuleRingCache(self.ring_buffers) if self.ring_buffers is not None else None

    def decode_step(self, token_ids: Tensor, slot_ids: Tensor, layer_rings: Sequence[LayerRings], cache: Optional[SlotAccessMixin] = None) -> Tensor:
        """One launch: a token per row through every layer; returns the hidden states."""
        hidden = self.embed(token_ids)
        for i, layer in enumerate(self.layers):
            rings = cache.layer(i) if cache is not None else layer_rings[i]
            hidden = hidden + layer(hidden, slot_ids, rings, cache=cache, layer_idx=i)
        return hidden

    @torch.no_grad()
    def forward(self, batch: RaggedBatchWrapper, cache: SlotAccessMixin) -> Tensor:
        """Logits (float32) of each sequence's last new token."""
        last = batch.last_step()
        logits = torch.zeros(len(batch.current_sequences), self._config.vocab_size, dtype=torch.float32)
        for step in range(batch.num_steps):
            token_ids, slot_ids = batch.step(step)
            hidden = self.decode_step(token_ids, slot_ids, (), cache=cache)
            done = last == step
            if bool(done.any()):
                logits[done] = self.lm_head(hidden[done]).float()
        return logits

    @torch.no_grad()
    def prefill_export(self, token_ids: Tensor) -> Tuple[List[Dict[str, Tensor]], Tensor]:
        """Per layer, the slot rows a short prompt leaves (see ``DSKDAAttention.prefill_rows``),
        and the float32 logits of its last token."""
        hidden = self.embed(token_ids)
        layers = []
        for layer in self.layers:
            rows, out = layer.prefill_rows(hidden)
            hidden = hidden + out
            layers.append(rows)
        return layers, self.lm_head(hidden[-1:]).float()
