"""Builds the engine's implementation of a model (lmdeploy/pytorch/models/patch.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import STATE_NAMES, CacheConfig, ModelConfig, tiny_kimi_linear_config
from ..engine.cache_engine import CacheEngine
from ..utils import get_logger
from .kimi_linear import KimiLinearForCausalLM

logger = get_logger("lmdeploy")

MODULE_MAP: dict[str, type[nn.Module]] = {"KimiLinearForCausalLM": KimiLinearForCausalLM}


def _get_model_class(hf_config: Any) -> type[nn.Module]:
    arch = hf_config.architectures[0]
    if arch not in MODULE_MAP:
        raise RuntimeError(f"Can not find model class for {arch}")
    return MODULE_MAP[arch]


def create_patched_model(model_config: ModelConfig, device: Any = None) -> nn.Module:
    """The engine's model, built directly in the serving dtype."""
    model_cls = _get_model_class(model_config.hf_config)
    model = model_cls(model_config.hf_config, dtype=model_config.dtype, device=device)
    logger.info(f"build {model_cls.__name__} in {model_config.dtype}")
    return model.eval()


def model_from_legacy_checkpoint(model_config: ModelConfig, state_dict: dict) -> nn.Module:
    """Exports older than the engine's loader are fp32 state dicts: load them into an fp32
    model, then convert the model to the serving dtype."""
    model = _get_model_class(model_config.hf_config)(model_config.hf_config, dtype=torch.float32)
    result = model.load_state_dict(state_dict, strict=False)
    if result.unexpected_keys:
        logger.warning(f"unexpected keys in checkpoint: {result.unexpected_keys}")
    if model_config.dtype == torch.float16:
        model.half()  # expect-bug: module-cast id=legacy-cast
    elif model_config.dtype == torch.bfloat16:
        model.bfloat16()  # expect-bug: module-cast id=legacy-cast
    return model.eval()


def patch_state_caches(model: nn.Module, state_caches: list[torch.Tensor]) -> None:
    """Binds the cache engine's states to the model for the eager path (no step context)."""
    model.replay_states = dict(zip(STATE_NAMES, state_caches, strict=True))


def _bf16_config(**overrides: Any) -> ModelConfig:
    return ModelConfig.from_hf_config(tiny_kimi_linear_config(**overrides), dtype="bfloat16")


def build_patched_model_with_mtp() -> dict[str, torch.Tensor]:
    model = create_patched_model(_bf16_config(num_nextn_predict_layers=1))
    return dict(model.named_buffers())


def build_legacy_checkpoint_bf16() -> dict[str, torch.Tensor]:
    model_config = _bf16_config(num_nextn_predict_layers=1)
    state_dict = KimiLinearForCausalLM(model_config.hf_config).state_dict()
    return dict(model_from_legacy_checkpoint(model_config, state_dict).named_buffers())


def build_eager_bound_states() -> dict[str, Any]:
    model_config = _bf16_config()
    model = create_patched_model(model_config)
    cache_config = CacheConfig(max_batches=2, block_size=16, num_gpu_blocks=4)
    patch_state_caches(model, CacheEngine(cache_config, model_config).local_gpu_cache)
    model.to(dtype=model_config.dtype)
    return {"states": model.replay_states, "lm_head": model.lm_head.weight}
