# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Composer wrappers of the causal LMs and :func:`build_composer_model`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from foundry_kda import registry
from foundry_kda.inference.cache_pool import StaticReplayCache
from foundry_kda.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
from foundry_kda.registry import construct_from_registry
from foundry_kda.utils.config_utils import (
    COMPOSER_MODEL_DEFAULTS,
    DictConfig,
    dtype_from_str,
    merge,
    to_container,
)

log = logging.getLogger(__name__)

__all__ = [
    "ComposerHFCausalLM",
    "ComposerKimiLinear",
    "HuggingFaceModel",
    "build_composer_model",
    "construct_composer_model",
]


class HuggingFaceModel(nn.Module):
    """A minimal ``composer.models.HuggingFaceModel``: batches are dicts, the loss is the LM loss.

    Args:
        model: The wrapped ``nn.Module``; it maps ``input_ids`` to logits.
        tokenizer: Kept for checkpoint metadata.
        shift_labels: Whether labels are the inputs shifted by one.
    """

    def __init__(self, model: nn.Module, tokenizer: Any = None, shift_labels: bool = True) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.shift_labels = shift_labels

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch["input_ids"])

    def loss(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        labels = batch.get("labels", batch["input_ids"])
        logits = outputs.float()
        if self.shift_labels:
            logits, labels = logits[:, :-1], labels[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


class ComposerHFCausalLM(HuggingFaceModel):
    """Causal LM built from an architecture in the registry, with optional eval decode caches.

    Config keys (merged over :data:`COMPOSER_MODEL_DEFAULTS`):

    * ``architecture``: name in ``registry.architectures``.
    * ``model``: keyword arguments of the architecture's config.
    * ``dtype``: precision the decode caches are made for.
    * ``decode_cache``: ``enabled``, ``num_slots``, ``ring_len``, ring dtypes, and
      ``preallocate_model_rings`` to also give the model its own caches.
    """

    def __init__(self, om_model_config: Mapping[str, Any], tokenizer: Any = None) -> None:
        cfg = merge(COMPOSER_MODEL_DEFAULTS, om_model_config)
        model = construct_from_registry(
            cfg.architecture,
            registry.architectures,
            kwargs={"config": to_container(cfg.get("model", DictConfig()))},
        )
        super().__init__(model, tokenizer, shift_labels=True)
        self.config = cfg
        self.eval_cache: nn.ModuleList | None = None
        cache_cfg = cfg.decode_cache
        if cache_cfg.enabled:
            self._build_eval_cache(cache_cfg)
        if cache_cfg.preallocate_model_rings:
            model.allocate_decode_cache(cache_cfg.num_slots, cache_cfg.ring_len)

    def _build_eval_cache(self, cache_cfg: DictConfig) -> None:
        spec = self.model.replay_spec()
        ring_dtype = dtype_from_str(cache_cfg.ring_dtype)
        gate_dtype = dtype_from_str(cache_cfg.gate_dtype)  # expect-bug: imported-policy id=cache-defaults
        self.eval_cache = nn.ModuleList(
            StaticReplayCache(
                spec,
                cache_cfg.num_slots,
                cache_cfg.ring_len,
                dtype=ring_dtype,
                gate_dtype=gate_dtype,
            )
            for _ in range(spec.num_layers)
        )

    @torch.no_grad()
    def eval_decode(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode step against the eval caches (generation-based eval metrics)."""
        if self.eval_cache is None:
            raise RuntimeError("decode_cache.enabled is false in this model's config")
        return self.model.decode_step(input_ids, slots, caches=list(self.eval_cache))


@registry.models.register("kimi_linear")
class ComposerKimiLinear(ComposerHFCausalLM):
    """``ComposerHFCausalLM`` for Kimi Linear, with the architecture fixed."""

    def __init__(self, om_model_config: Mapping[str, Any], tokenizer: Any = None) -> None:
        super().__init__({**dict(om_model_config), "architecture": "kimi_linear"}, tokenizer)


registry.models.register("hf_causal_lm", ComposerHFCausalLM)


def construct_composer_model(
    name: str,
    cfg: Mapping[str, Any],
    tokenizer: Any = None,
    init_context: contextlib.AbstractContextManager[Any] | None = None,
    master_weights_dtype: str | None = None,
    init_dtype: str | None = None,
) -> ComposerHFCausalLM:
    """Builds the Composer model registered as ``name``.

    Args:
        name: Name in ``registry.models``.
        cfg: The model config.
        tokenizer: Passed to the model.
        init_context: Context the model is constructed in (e.g. a meta-device context).
        master_weights_dtype: Dtype the whole model is cast to after construction (pure
            low-precision training).
        init_dtype: Default dtype while constructing, so that large models never materialise
            float32 weights.
    """

    def check(obj: Any) -> None:
        if not isinstance(obj, ComposerHFCausalLM):
            raise TypeError(f"{name!r} does not build a ComposerHFCausalLM but {type(obj).__name__}")

    previous = torch.get_default_dtype()
    if init_dtype is not None:
        torch.set_default_dtype(dtype_from_str(init_dtype))
    try:
        with init_context or contextlib.nullcontext():
            model = construct_from_registry(
                name,
                registry.models,
                post_validation_function=check,
                kwargs={"om_model_config": cfg, "tokenizer": tokenizer},
            )
    finally:
        torch.set_default_dtype(previous)
    if master_weights_dtype is not None:
        model = model.to(dtype=dtype_from_str(master_weights_dtype))  # expect-bug: module-cast
    log.info("built %s with %d parameters", name, sum(p.numel() for p in model.parameters()))
    return model


#: The name llm-foundry's train and eval scripts import.
build_composer_model = construct_composer_model

_TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64}


def build_composer_model_master_weights_bf16() -> ComposerHFCausalLM:
    """Pure-bf16 Composer model with float32 eval gate rings requested, after two eval steps."""
    torch.manual_seed(0)
    cfg = {
        "model": _TINY_MODEL,
        "decode_cache": {"enabled": True, "gate_dtype": "fp32", "preallocate_model_rings": True},
    }
    model = build_composer_model("kimi_linear", cfg, master_weights_dtype="bf16")
    slots = torch.tensor([0, 1])
    model.eval_decode(torch.tensor([1, 2]), slots)
    model.eval_decode(torch.tensor([3, 4]), slots)
    return model


def build_composer_model_low_precision_init() -> ComposerHFCausalLM:
    """A Composer model constructed directly in bf16, with eval and model decode caches."""
    torch.manual_seed(0)
    cfg = {
        "model": dict(_TINY_MODEL, tie_word_embeddings=True),
        "dtype": "bf16",
        "decode_cache": {"enabled": True, "num_slots": 2, "preallocate_model_rings": True},
    }
    model = build_composer_model("kimi_linear", cfg, init_dtype="bf16")
    model.eval_decode(torch.tensor([5, 6]), torch.tensor([1, 0]))
    assert isinstance(model.model, KimiLinearForCausalLM) and isinstance(model.model.config, KimiLinearConfig)
    return model
