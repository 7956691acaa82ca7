# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Online RL trainers (GRPO, online DPO) for Kimi Delta Attention models, laid out like TRL.

``trl_kda.models`` holds the KDA causal LM, its ReplaySSM decode caches and the model helpers
(reference models, DeepSpeed preparation, unwrapping for generation); ``trl_kda.extras`` the
colocated generation engine, its rollout ring pools and the client that moves weights and
decode states to a generation server; ``trl_kda.trainer`` the configs, the trainers and their
dtype helpers. Attributes are resolved lazily so that importing the package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.21.0.dev0"

_import_structure: dict[str, list[str]] = {
    "models": ["KDAConfig", "KDAForCausalLM", "create_reference_model", "prepare_deepspeed"],
    "extras": ["ColocatedEngine", "EngineArgs", "RolloutRingPool", "VLLMClient"],
    "trainer": ["GRPOConfig", "GRPOTrainer", "OnlineDPOConfig", "OnlineDPOTrainer"],
}


def __getattr__(name: str) -> Any:
    for module, names in _import_structure.items():
        if name in names:
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", *(name for names in _import_structure.values() for name in names)]
