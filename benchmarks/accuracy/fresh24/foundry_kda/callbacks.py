# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Training-loop callbacks, with a minimal Composer-style event loop.

Composer calls ``callback.run_event(event, state, logger)`` at every event of the loop; the
base class dispatches to the method named after the event (``fit_start``, ``eval_start``...).
The callbacks here manage the ReplaySSM decode caches used by generation-based evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import nn

from foundry_kda import registry
from foundry_kda.inference.cache_pool import LayerRings, ReplayCachePool
from foundry_kda.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
from foundry_kda.precision import Precision, default_dtype, ring_dtypes_for
from foundry_kda.utils import dist

__all__ = [
    "Callback",
    "EvalCacheReset",
    "Event",
    "Logger",
    "ReplayCacheMonitor",
    "ReplayCacheWarmup",
    "State",
    "make_callback",
]


class Event(str, Enum):
    FIT_START = "fit_start"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"


@dataclass
class State:
    """The parts of ``composer.core.State`` these callbacks read."""

    model: nn.Module
    precision: Precision = Precision.AMP_BF16
    run_name: str = "kimi-linear"
    eval_batch_size: int = 1
    eval_caches: list[LayerRings] = field(default_factory=list)


class Logger:
    """Collects logged metrics (stands in for Composer's logger destinations)."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.history.append(dict(metrics))


class Callback:
    """Base class: override the methods of the events you need."""

    def run_event(self, event: Event | str, state: State, logger: Logger) -> None:
        handler = getattr(self, Event(event).value, None)
        if handler is not None:
            handler(state, logger)

    def fit_start(self, state: State, logger: Logger) -> None:
        del state, logger

    def eval_start(self, state: State, logger: Logger) -> None:
        del state, logger

    def eval_end(self, state: State, logger: Logger) -> None:
        del state, logger


def _unwrap(model: nn.Module) -> Any:
    """The architecture inside a Composer wrapper (``HuggingFaceModel.model``) or the model itself."""
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, nn.Module) and hasattr(inner, "replay_spec") else model


@registry.callbacks.register("replay_cache_warmup")
class ReplayCacheWarmup(Callback):
    """Allocates the eval decode caches at ``FIT_START``, so that the first eval does not.

    The caches are made in the dtype of the model's weights.

    Args:
        num_slots: Slots per cache; the eval batch size when omitted.
        ring_len: Ring length.
    """

    def __init__(self, num_slots: int | None = None, ring_len: int = 4) -> None:
        self.num_slots = num_slots
        self.ring_len = ring_len

    def fit_start(self, state: State, logger: Logger) -> None:
        model = _unwrap(state.model)
        spec = model.replay_spec()
        num_slots = self.num_slots or state.eval_batch_size
        shapes = spec.ring_shapes(num_slots, self.ring_len)
        caches = []
        with default_dtype(next(model.parameters()).dtype):
            for _ in range(spec.num_layers):
                d_cache = torch.zeros(shapes["d_cache"])
                k_cache = torch.zeros(shapes["k_cache"])
                g_cache = torch.zeros(shapes["g_cache"])  # expect-bug: default-dtype
                checkpoint = torch.zeros(shapes["state"], dtype=torch.float32)
                write_pos = torch.zeros(num_slots, dtype=torch.int32)
                caches.append(LayerRings(checkpoint, d_cache, k_cache, g_cache, write_pos))
        state.eval_caches = caches
        if dist.get_global_rank() == 0:
            logger.log_metrics({"replay_cache/bytes": float(sum(c.nbytes() for c in caches))})


@registry.callbacks.register("eval_cache_reset")
class EvalCacheReset(Callback):
    """Gives every evaluation clean decode caches.

    Caches of the right size are zeroed in place; when the eval batch size changed since they
    were made, they are reallocated like the old ones with the new number of slots.
    """

    def eval_start(self, state: State, logger: Logger) -> None:
        num_slots = state.eval_batch_size
        reallocated = 0
        for index, rings in enumerate(state.eval_caches):
            if rings.num_slots == num_slots:
                rings.zero_()
                continue
            checkpoint = rings.state.new_zeros((num_slots, *rings.state.shape[1:]))
            d_cache = rings.d_cache.new_zeros((num_slots, *rings.d_cache.shape[1:]))
            k_cache = rings.k_cache.new_zeros((num_slots, *rings.k_cache.shape[1:]))
            g_cache = rings.k_cache.new_zeros((num_slots, *rings.g_cache.shape[1:]))  # expect-bug: like
            write_pos = rings.write_pos.new_zeros(num_slots)
            state.eval_caches[index] = LayerRings(checkpoint, d_cache, k_cache, g_cache, write_pos)
            reallocated += 1
        logger.log_metrics({"replay_cache/reallocated_layers": float(reallocated)})


@registry.callbacks.register("replay_cache_monitor")
class ReplayCacheMonitor(Callback):
    """Logs how much the eval caches' log-decays and checkpoints move between evaluations."""

    def __init__(self) -> None:
        self.g_cache_reference: list[torch.Tensor] = []
        self.state_norms: list[float] = []

    def fit_start(self, state: State, logger: Logger) -> None:
        self.g_cache_reference = [torch.zeros_like(rings.g_cache) for rings in state.eval_caches]

    def eval_end(self, state: State, logger: Logger) -> None:
        metrics = {}
        for i, (rings, reference) in enumerate(zip(state.eval_caches, self.g_cache_reference, strict=True)):
            metrics[f"replay_cache/layer_{i}/g_drift"] = (
                (rings.g_cache.float() - reference).abs().mean().item()
            )
            metrics[f"replay_cache/layer_{i}/state_norm"] = rings.state.float().norm().item()
            reference.copy_(rings.g_cache)
        self.state_norms.append(sum(v for k, v in metrics.items() if k.endswith("state_norm")))
        logger.log_metrics(metrics)


def make_callback(name: str, kwargs: dict[str, Any] | None = None) -> Callback:
    return registry.callbacks.get(name)(**(kwargs or {}))


def _tiny_bf16_model() -> KimiLinearForCausalLM:
    return KimiLinearForCausalLM(KimiLinearConfig()).to(torch.bfloat16)


def build_eval_callbacks() -> dict[str, object]:
    """Warm-up caches made at FIT_START, and caches reallocated for a larger eval batch."""
    torch.manual_seed(0)
    model = _tiny_bf16_model()
    logger = Logger()
    warm = State(model=model, eval_batch_size=2)
    make_callback("replay_cache_warmup", {"ring_len": 4}).run_event(Event.FIT_START, warm, logger)
    pool = ReplayCachePool(
        model.replay_spec(), num_slots=2, ring_len=4, ring_dtypes=ring_dtypes_for("amp_bf16")
    )
    evaluating = State(model=model, eval_batch_size=3, eval_caches=list(pool.layers))
    make_callback("eval_cache_reset").run_event(Event.EVAL_START, evaluating, logger)
    return {"warmup": warm.eval_caches, "eval": evaluating.eval_caches}


def build_cache_monitor() -> dict[str, object]:
    """A monitored eval: caches zeroed at EVAL_START, decoded into, drift logged at EVAL_END."""
    torch.manual_seed(0)
    model = _tiny_bf16_model()
    pool = ReplayCachePool(
        model.replay_spec(), num_slots=2, ring_len=4, ring_dtypes=ring_dtypes_for("amp_bf16")
    )
    state = State(model=model, eval_batch_size=2, eval_caches=list(pool.layers))
    logger = Logger()
    callbacks = [make_callback("replay_cache_monitor"), make_callback("eval_cache_reset")]
    for callback in callbacks:
        callback.run_event(Event.FIT_START, state, logger)
        callback.run_event(Event.EVAL_START, state, logger)
    model.decode_step(torch.tensor([1, 2]), torch.tensor([0, 1]), caches=state.eval_caches)
    for callback in callbacks:
        callback.run_event(Event.EVAL_END, state, logger)
    return {"caches": state.eval_caches, "monitor": callbacks[0]}
