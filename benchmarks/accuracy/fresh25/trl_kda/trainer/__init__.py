# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Configs, trainers and their helpers. Trainers are imported on first use."""

from __future__ import annotations

import importlib
from typing import Any

from trl_kda.trainer.grpo_config import GRPOConfig, RolloutBufferDtypes

_LAZY = {
    "GRPOTrainer": "grpo_trainer",
    "OnlineDPOConfig": "online_dpo_trainer",
    "OnlineDPOTrainer": "online_dpo_trainer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GRPOConfig", "RolloutBufferDtypes", *_LAZY]
