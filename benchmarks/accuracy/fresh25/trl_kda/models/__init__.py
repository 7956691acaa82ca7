# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""The KDA causal LM, its ReplaySSM decode kernel and the model helpers of the trainers."""

from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAAttention, KDAConfig, KDAForCausalLM, ReplayCache
from trl_kda.models.replayssm import fused_recurrent_kda_replayssm_decode, kda_log_decay
from trl_kda.models.utils import create_reference_model, prepare_deepspeed, sync_ref_model, unwrap_model_for_generation

__all__ = [
    "TINY_MODEL_ID",
    "KDAAttention",
    "KDAConfig",
    "KDAForCausalLM",
    "ReplayCache",
    "create_reference_model",
    "fused_recurrent_kda_replayssm_decode",
    "kda_log_decay",
    "prepare_deepspeed",
    "sync_ref_model",
    "unwrap_model_for_generation",
]
