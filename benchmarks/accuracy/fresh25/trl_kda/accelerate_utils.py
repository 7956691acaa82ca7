# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""A single-process stand-in for the parts of ``accelerate`` the trainers use.

The trainers are written against the ``Accelerator`` API (``prepare``, ``unwrap_model``,
``autocast``, ``gather``, the DeepSpeed plugin on the state). This module implements that API
for one CPU process so the trainers run the same code paths in tests and small experiments:
``prepare`` wraps models the way DDP or a DeepSpeed engine would (``model.module`` is the
original) without touching their weights, collectives return their input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_MIXED_PRECISION_MODES = ("no", "fp16", "bf16")


@dataclass
class DeepSpeedPlugin:
    """The DeepSpeed settings of an accelerate config (``zero_stage``, mixed precision)."""

    zero_stage: int = 2
    mixed_precision: str = "no"
    offload_param_device: str = "none"
    deepspeed_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mixed_precision not in _MIXED_PRECISION_MODES:
            raise ValueError(f"unknown mixed precision {self.mixed_precision!r}")
        if not self.deepspeed_config:
            self.deepspeed_config = {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {
                    "stage": self.zero_stage,
                    "offload_param": {"device": self.offload_param_device},
                },
                "bf16": {"enabled": self.mixed_precision == "bf16"},
                "fp16": {"enabled": self.mixed_precision == "fp16"},
            }


@dataclass
class AcceleratorState:
    """Process layout and precision settings shared by every ``Accelerator``."""

    mixed_precision: str = "no"
    deepspeed_plugin: DeepSpeedPlugin | None = None
    num_processes: int = 1
    process_index: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


class DistributedModel(nn.Module):
    """What ``prepare`` returns for a model outside DeepSpeed: a wrapper with ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class DeepSpeedEngine(nn.Module):
    """What ``deepspeed.initialize`` returns: the module and the config it was built with."""

    def __init__(self, module: nn.Module, config: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self.config = config

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @property
    def zero_optimization_stage(self) -> int:
        return int(self.config.get("zero_optimization", {}).get("stage", 0))


class Accelerator:
    """One-process ``Accelerator``: wraps models, unwraps them and runs collectives locally."""

    def __init__(
        self,
        mixed_precision: str = "no",
        deepspeed_plugin: DeepSpeedPlugin | None = None,
        cpu: bool = True,
    ) -> None:
        if mixed_precision not in _MIXED_PRECISION_MODES:
            raise ValueError(f"unknown mixed precision {mixed_precision!r}")
        if deepspeed_plugin is not None and deepspeed_plugin.mixed_precision == "no":
            deepspeed_plugin.mixed_precision = mixed_precision
        self.state = AcceleratorState(mixed_precision=mixed_precision, deepspeed_plugin=deepspeed_plugin)
        self.cpu = cpu

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def is_main_process(self) -> bool:
        return self.state.process_index == 0

    def prepare(self, *objects: Any) -> Any:
        prepared = tuple(self._prepare_one(obj) for obj in objects)
        return prepared[0] if len(prepared) == 1 else prepared

    def _prepare_one(self, obj: Any) -> Any:
        if not isinstance(obj, nn.Module):
            return obj
        plugin = self.state.deepspeed_plugin
        if plugin is not None:
            return DeepSpeedEngine(obj, plugin.deepspeed_config)
        return DistributedModel(obj)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        while isinstance(model, (DistributedModel, DeepSpeedEngine)):
            model = model.module
        return model

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.mixed_precision == "no":
            yield
            return
        dtype = torch.bfloat16 if self.mixed_precision == "bf16" else torch.float16
        with torch.autocast(device_type="cpu", dtype=dtype):
            yield

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def wait_for_everyone(self) -> None:
        return None


def is_deepspeed_zero3_enabled(accelerator: Accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and plugin.zero_stage == 3
