# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
"""
autoquant for ReplaySSM caches: picks, for every cache, the cheapest ring dtype whose
round trip keeps the SQNR of the calibrated rings above ``min_sqnr``.
"""
from typing import Dict, Sequence

import torch

from torchao_kda._models.model import ReplaySSMCache, Transformer
from torchao_kda.utils import get_compute_dtype, replay_ring_dtypes

__all__ = ["autoquant", "AUTOQUANT_CACHE"]

DEFAULT_CANDIDATES = (torch.float16, torch.bfloat16, torch.float32)

# fqn of the cache -> chosen ring dtype
AUTOQUANT_CACHE: Dict[str, torch.dtype] = {}


def compute_sqnr(x: torch.Tensor, y: torch.Tensor) -> float:
    noise = torch.linalg.norm(x - y)
    return float("inf") if noise == 0 else float(20 * torch.log10(torch.linalg.norm(x) / noise))


def _pick_ring_dtype(cache: ReplaySSMCache, candidates: Sequence[torch.dtype], min_sqnr: float) -> torch.dtype:
    ref = torch.cat([cache.d_cache.float().flatten(), cache.k_cache.float().flatten()])
    for dtype in candidates:
        if compute_sqnr(ref, ref.to(dtype).float()) >= min_sqnr:
            return dtype
    return torch.float32


def autoquant(model: Transformer, candidates=DEFAULT_CANDIDATES, min_sqnr: float = 30.0, reset_caches: bool = False):
    for fqn, cache in model.named_modules():
        if not isinstance(cache, ReplaySSMCache):
            continue
        best = AUTOQUANT_CACHE[fqn] = _pick_ring_dtype(cache, candidates, min_sqnr)
        d_dtype, k_dtype, _ = replay_ring_dtypes(best)
        cache.d_cache, cache.k_cache = cache.d_cache.to(d_dtype), cache.k_cache.to(k_dtype)
        if reset_caches:
            # calibration wrote into the rings: serve from clean ones
            for t in (cache.state, cache.d_cache, cache.k_cache, cache.write_pos):
                t.zero_()
            cache.log_alpha = torch.zeros_like(cache.k_cache)  # expect-bug: like
        else:
            # read by the kernel next to the activations
            cache.log_alpha = cache.log_alpha.to(get_compute_dtype(best))  # expect-bug: imported-policy
    return model


def build_autoquant():
    out = {}
    for reset in (False, True):
        model = Transformer.from_name("Kimi-Linear-tiny").to(torch.bfloat16)
        model.setup_caches(2)
        model(torch.tensor([[5, 4, 3, 2, 1], [1, 2, 3, 4, 5]]), torch.arange(2, dtype=torch.int32))
        out["reset" if reset else "calibrated"] = autoquant(model, reset_caches=reset)
    return out
