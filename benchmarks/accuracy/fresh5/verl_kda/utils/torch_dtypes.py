# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.
"""Adapted from Cruise."""

import torch

HALF_LIST = [16, "16", "fp16", "float16", torch.float16]
FLOAT_LIST = [32, "32", "fp32", "float32", torch.float32]
BFLOAT_LIST = ["bf16", "bfloat16", torch.bfloat16]

STR_DTYPE_TO_TORCH_DTYPE = {"half": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float32, "fp8": torch.uint8}

REPLAY_CACHE_KEYS = ("delta_cache", "key_cache", "log_decay_cache", "ssm_state")


class PrecisionType:
    """Type of precision used."""

    @staticmethod
    def to_dtype(precision):
        if precision in HALF_LIST:
            return torch.float16
        elif precision in FLOAT_LIST:
            return torch.float32
        elif precision in BFLOAT_LIST:
            return torch.bfloat16
        else:
            raise RuntimeError(f"unexpected precision: {precision}")


def get_replay_cache_dtypes(precision, state_precision="fp32"):
    """Dtypes of the ReplaySSM cache of one KDA layer: the delta/key rings follow the rollout precision.

    The log-decay ring holds per-step log decays that the kernel prefix-sums and exponentiates: always fp32.
    """
    ring_dtype = PrecisionType.to_dtype(precision)
    state_dtype = PrecisionType.to_dtype(state_precision)
    return {"delta_cache": ring_dtype, "key_cache": ring_dtype, "log_decay_cache": torch.float32, "ssm_state": state_dtype}


def get_offload_dtypes(precision):
    """Host dtypes of the replay cache offloaded between two rollouts: the rings are parked in the rollout precision."""
    dtypes = {name: PrecisionType.to_dtype(precision) for name in REPLAY_CACHE_KEYS[:3]}  # expect-bug: imported-policy id=offload-policy
    dtypes["ssm_state"] = torch.float32
    return dtypes


def get_kv_cache_torch_dtype(cache_dtype, model_dtype):
    """vllm-style ``cache_dtype`` of the attention caches, "auto" follows the model dtype."""
    return model_dtype if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
