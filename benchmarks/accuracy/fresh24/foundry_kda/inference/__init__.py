# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""ReplaySSM decode caches, host offload and generation loops."""

from foundry_kda.inference.cache_pool import LayerRings, ReplayCachePool, StaticReplayCache

__all__ = ["LayerRings", "ReplayCachePool", "StaticReplayCache"]
