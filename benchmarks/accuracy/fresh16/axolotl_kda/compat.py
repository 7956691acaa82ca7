"""Stand-ins for the few ``transformers`` pieces the callbacks and config helpers rely on."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

PREFIX_CHECKPOINT_DIR = "checkpoint"


def is_torch_bf16_gpu_available() -> bool:
    """True when a CUDA device with bfloat16 support is present."""
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


@dataclasses.dataclass
class TrainingArguments:
    output_dir: str
    per_device_eval_batch_size: int = 1
    save_steps: int = 10
    eval_steps: int = 10


@dataclasses.dataclass
class TrainerState:
    global_step: int = 0
    epoch: float = 0.0
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainerControl:
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


class TrainerCallback:
    """Hooks a trainer calls at fixed points; each returns the (possibly updated) ``control``."""

    def on_train_begin(self, args, state, control, **kwargs):
        return control

    def on_evaluate(self, args, state, control, **kwargs):
        return control

    def on_save(self, args, state, control, **kwargs):
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        return control

    def on_train_end(self, args, state, control, **kwargs):
        return control
