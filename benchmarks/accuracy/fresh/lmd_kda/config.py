"""Engine configs (lmdeploy/pytorch/config.py) and the Kimi-Linear model config builders."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from .utils import get_logger, str_to_torch_dtype

logger = get_logger("lmdeploy")

StateShape = tuple[tuple[int, ...], torch.dtype]

# The states of the KDA layers, in the order of ``ModelConfig.states_shapes``.
STATE_NAMES = ("recurrent_state", "d_cache", "k_cache", "g_cache")


@dataclass
class CacheConfig:
    """Config of the caches: paged blocks of the attention layers, slots of the KDA states."""

    max_batches: int
    block_size: int
    num_gpu_blocks: int
    num_state_caches: int | None = None
    num_cpu_state_caches: int = 0
    num_prefix_snapshots: int = 0

    def __post_init__(self) -> None:
        if self.num_state_caches is None:
            self.num_state_caches = self.max_batches + 1  # slot 0 pads graph batches


@dataclass
class ModelConfig:
    hidden_size: int
    num_layers: int
    vocab_size: int
    dtype: torch.dtype = torch.float16
    hf_config: Any = None
    states_shapes: list[StateShape] = field(default_factory=list)

    @classmethod
    def from_hf_config(cls, hf_config: Any, dtype: str = "auto") -> ModelConfig:
        if dtype == "auto":
            dtype = getattr(hf_config, "torch_dtype", None) or "float16"
        torch_dtype = str_to_torch_dtype(str(dtype))
        for builder in _CONFIG_BUILDERS:
            if builder.condition(hf_config):
                return builder.build(hf_config, torch_dtype)
        raise RuntimeError(f"Unsupported model type: {hf_config.model_type}")


def replay_states_shapes(
    num_layers: int,
    linear: dict[str, Any],
    dtype: torch.dtype,
    gate_dtype: torch.dtype = torch.bfloat16,  # expect-bug: container id=gate-default
) -> list[StateShape]:
    """Per-slot shapes and dtypes of the KDA states: the checkpoint state and the three rings."""
    heads, k_heads = linear["num_heads"], linear["num_k_heads"]
    dim, ring = linear["head_dim"], linear["replay_len"]
    return [
        ((num_layers, heads, dim, dim), torch.float32),
        ((num_layers, heads, ring, dim), dtype),
        ((num_layers, k_heads, ring, dim), dtype),
        ((num_layers, heads, ring, dim), gate_dtype),
    ]


def snapshot_state_dtypes(model_config: ModelConfig) -> dict[str, torch.dtype]:
    """Storage dtype of each state in the prefix-cache snapshots (host memory is the budget)."""
    dtype = model_config.dtype
    return {
        "recurrent_state": torch.float32,
        "d_cache": dtype,
        "k_cache": dtype,
        "g_cache": dtype,  # expect-bug: imported-policy
    }


def _default_model_config(hf_config: Any, dtype: torch.dtype) -> ModelConfig:
    hidden_size, num_layers = hf_config.hidden_size, hf_config.num_hidden_layers
    return ModelConfig(hidden_size, num_layers, hf_config.vocab_size, dtype, hf_config)


class KimiLinearModelConfigBuilder:
    @classmethod
    def condition(cls, hf_config: Any) -> bool:
        return hf_config.model_type == "kimi_linear"

    @classmethod
    def build(cls, hf_config: Any, dtype: torch.dtype) -> ModelConfig:
        cfg = _default_model_config(hf_config, dtype)
        linear = hf_config.linear_attn_config
        num_layers = len(linear["kda_layers"])
        cfg.states_shapes = replay_states_shapes(num_layers, linear, dtype, torch.float32)
        return cfg


class KimiLinearMTPConfigBuilder:
    """The separately shipped MTP draft of Kimi-Linear: ``num_nextn_predict_layers`` KDA layers."""

    @classmethod
    def condition(cls, hf_config: Any) -> bool:
        return hf_config.model_type == "kimi_linear_mtp"

    @classmethod
    def build(cls, hf_config: Any, dtype: torch.dtype) -> ModelConfig:
        cfg = _default_model_config(hf_config, dtype)
        linear = hf_config.linear_attn_config
        cfg.num_layers = hf_config.num_nextn_predict_layers
        cfg.states_shapes = replay_states_shapes(  # expect-bug: container id=gate-default
            cfg.num_layers, linear, dtype
        )
        logger.info(f"MTP draft with {cfg.num_layers} KDA layer(s)")
        return cfg


_CONFIG_BUILDERS = (KimiLinearModelConfigBuilder, KimiLinearMTPConfigBuilder)


def tiny_kimi_linear_config(**overrides: Any) -> SimpleNamespace:
    """A small HuggingFace-style Kimi-Linear config (tests and the CPU smoke runs)."""
    linear = {"num_heads": 2, "num_k_heads": 1, "head_dim": 4, "replay_len": 4}
    values: dict[str, Any] = {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 0,
        "linear_attn_config": {**linear, "kda_layers": [0, 1], "gate_lower_bound": None},
    }
    values.update(overrides)
    return SimpleNamespace(**values)
