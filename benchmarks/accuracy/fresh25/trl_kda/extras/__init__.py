# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Generation-side components: rollout ring pools, the colocated engine, the server client."""

from trl_kda.extras.colocate_engine import ColocatedEngine, EngineArgs, SamplingParams
from trl_kda.extras.rollout_pool import RingGeometry, RolloutRingPool
from trl_kda.extras.vllm_client import VLLMClient

__all__ = ["ColocatedEngine", "EngineArgs", "RingGeometry", "RolloutRingPool", "SamplingParams", "VLLMClient"]
