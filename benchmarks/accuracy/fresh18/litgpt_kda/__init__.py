# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""LitGPT-style Kimi Delta Attention models with ReplaySSM decoding."""

from litgpt_kda.config import Config
from litgpt_kda.kv_cache import ReplayCache, ReplayCachePool
from litgpt_kda.model import GPT, Block, KDAttention

__all__ = ["Config", "GPT", "Block", "KDAttention", "ReplayCache", "ReplayCachePool"]
