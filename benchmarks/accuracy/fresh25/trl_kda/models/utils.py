# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Model helpers of the trainers: reference models, DeepSpeed preparation, generation unwrap."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from trl_kda.accelerate_utils import Accelerator, DeepSpeedEngine, DeepSpeedPlugin
from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAForCausalLM, StaticReplayCache

__all__ = [
    "create_reference_model",
    "disable_dropout_in_model",
    "prepare_deepspeed",
    "sync_ref_model",
    "unwrap_model_for_generation",
]


@contextlib.contextmanager
def _gathered_parameters(model: nn.Module) -> Iterator[None]:
    """ZeRO-3 gathers the partitioned parameters here; one process holds them all already."""
    yield


@contextlib.contextmanager
def unwrap_model_for_generation(
    model: nn.Module, accelerator: Accelerator, gather_deepspeed3_params: bool = True
) -> Iterator[KDAForCausalLM]:
    """The bare model of a prepared one, with its ZeRO-3 parameters gathered for generation."""
    unwrapped = accelerator.unwrap_model(model)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or plugin.zero_stage != 3 or not gather_deepspeed3_params:
        yield unwrapped
        return
    with _gathered_parameters(unwrapped):
        yield unwrapped


def prepare_deepspeed(model: nn.Module, accelerator: Accelerator) -> DeepSpeedEngine:
    """Wraps a frozen model (the reference model) in an inference DeepSpeed engine.

    Uses the trainer's DeepSpeed config; ZeRO stages 1 and 2 have nothing to shard for a frozen
    model and run as stage 0. The engine holds the weights in the config's half-precision dtype.
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        raise ValueError("prepare_deepspeed needs an accelerator with a DeepSpeed plugin")
    config_kwargs = copy.deepcopy(plugin.deepspeed_config)
    stage = config_kwargs["zero_optimization"]["stage"]
    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    if stage == 3 and hidden_size is not None:
        config_kwargs["zero_optimization"].update(
            {
                "reduce_bucket_size": hidden_size * hidden_size,
                "stage3_param_persistence_threshold": 10 * hidden_size,
                "stage3_prefetch_bucket_size": 0,
            }
        )
    if stage != 3:
        config_kwargs["zero_optimization"]["stage"] = 0
    if config_kwargs.get("bf16", {}).get("enabled"):
        dtype = torch.bfloat16
    elif config_kwargs.get("fp16", {}).get("enabled"):
        dtype = torch.float16
    else:
        dtype = None
    if dtype is not None:
        model = model.to(dtype)  # expect-bug: module-cast
    engine = DeepSpeedEngine(model, config_kwargs)
    engine.eval()
    return engine


def create_reference_model(model: nn.Module, num_shared_layers: int | None = None) -> nn.Module:
    """A frozen copy of ``model``; the first ``num_shared_layers`` layers share the policy's."""
    reference = copy.deepcopy(model)
    if num_shared_layers is not None:
        layers = getattr(model, "layers", None)
        if layers is None or num_shared_layers > len(layers):
            raise ValueError(f"cannot share {num_shared_layers} layers of {type(model).__name__}")
        for idx in range(num_shared_layers):
            reference.layers[idx] = layers[idx]
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference.eval()


def disable_dropout_in_model(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@torch.no_grad()
def sync_ref_model(model: nn.Module, ref_model: nn.Module, alpha: float) -> None:
    """TR-DPO style mixing: ``ref <- alpha * policy + (1 - alpha) * ref``, parameters only."""
    for ref_param, param in zip(ref_model.parameters(), model.parameters(), strict=True):
        ref_param.mul_(1.0 - alpha).add_(param.to(ref_param.dtype), alpha=alpha)


def build_reference_model() -> dict[str, nn.Module]:
    """A bf16 policy and its DeepSpeed reference model, both decoding with ReplayCache rings."""
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype="bfloat16")
    policy.setup_replay_cache(num_slots=2)
    accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    ref_model = prepare_deepspeed(create_reference_model(policy), accelerator)
    prepared = accelerator.prepare(policy)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    with unwrap_model_for_generation(prepared, accelerator) as unwrapped:
        for token in ([1, 2], [3, 4], [5, 6]):
            unwrapped.decode_step(torch.tensor(token), slots)
    ref_model.module.decode_step(torch.tensor([1, 2]), slots)
    sync_ref_model(policy, ref_model.module, alpha=0.5)
    return {"policy": policy, "ref_model": ref_model}


def build_deepspeed_reference() -> DeepSpeedEngine:
    """The reference model of an fp32 policy whose rollout cache is a StaticReplayCache."""
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype="float32")
    policy.setup_replay_cache(num_slots=2, dtype=torch.bfloat16, cache_cls=StaticReplayCache)
    plugin = DeepSpeedPlugin(zero_stage=3, mixed_precision="bf16")
    accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=plugin)
    ref_model = prepare_deepspeed(create_reference_model(policy), accelerator)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    for token in ([2, 9], [4, 4]):
        ref_model.module.decode_step(torch.tensor(token), slots)
    return ref_model
