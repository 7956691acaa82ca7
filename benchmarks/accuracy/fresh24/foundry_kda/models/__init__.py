# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Kimi Linear architecture, its KDA layers and the Composer wrappers."""

from foundry_kda.models.kda_attention import (
    KDAConfig,
    KimiDeltaAttention,
    ReplayRingBuffers,
    ReplaySpec,
)
from foundry_kda.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM

__all__ = [
    "KDAConfig",
    "KimiDeltaAttention",
    "KimiLinearConfig",
    "KimiLinearForCausalLM",
    "ReplayRingBuffers",
    "ReplaySpec",
]
