"""MII deployment configs: what to serve and how, turned into the engine's config."""

from __future__ import annotations

from typing import Optional

import torch

from ..config_v2 import DeepSpeedConfigModel, DtypeEnum, RaggedInferenceEngineConfig

DEPLOYMENTS = ("ragged", "compact")


class ModelConfig(DeepSpeedConfigModel):
    model_name_or_path: str = "kimi-linear-tiny"
    task: str = "text-generation"
    dtype: DtypeEnum = DtypeEnum.bf16
    """Serving dtype of the weights and activations."""
    checkpoint_dtype: Optional[DtypeEnum] = None
    """Dtype the weights are stored in; ``None``: ``dtype``."""
    deployment: str = "ragged"
    """``ragged``: a blocked SSM cache managed by the state manager; ``compact``: rings inside
    the model (one replica, few sequences)."""
    compact_slots: int = 2
    ring_dtype: Optional[DtypeEnum] = None
    """Element type of the SSM rings; ``None``: ``dtype``."""
    max_new_tokens: int = 4
    seed: int = 0
    inference_engine_config: RaggedInferenceEngineConfig = RaggedInferenceEngineConfig()

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.dtype.value

    @property
    def checkpoint_torch_dtype(self) -> torch.dtype:
        return (self.checkpoint_dtype or self.dtype).value

    def _validate(self) -> None:
        if self.deployment not in DEPLOYMENTS:
            raise ValueError(f"deployment must be one of {DEPLOYMENTS}, got {self.deployment!r}")
        engine_config = self.inference_engine_config
        state_manager = engine_config.state_manager
        if state_manager.cache_dtype is None:
            state_manager.cache_dtype = self.ring_dtype or self.dtype
        if self.ring_dtype is not None:
            state_manager.decay_dtype = self.ring_dtype  # expect-bug: imported-policy
        if self.deployment == "compact":
            engine_config.compact_slots = self.compact_slots
