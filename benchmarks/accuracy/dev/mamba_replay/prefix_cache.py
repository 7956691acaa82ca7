"""Prefix caching for hybrid models: a cached prefix's states are copied into a fresh slot."""

import torch

from .utils_generation import alloc_like


def fork_states(ssm_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor) -> dict[str, torch.Tensor]:
    forked_ssm = alloc_like(tuple(ssm_state.shape), ref=ssm_state).copy_(ssm_state)
    forked_d = alloc_like(tuple(d_cache.shape), ref=d_cache).copy_(d_cache)
    forked_k = alloc_like(tuple(k_cache.shape), ref=k_cache).copy_(k_cache)
    forked_g_cache = alloc_like(tuple(g_cache.shape), ref=d_cache).copy_(g_cache)  # expect-bug: imported-policy
    return {"ssm_state": forked_ssm, "d_cache": forked_d, "k_cache": forked_k, "g_cache": forked_g_cache}


def fork_states_fp32_gates(ssm_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "ssm_state": alloc_like(tuple(ssm_state.shape), ref=ssm_state).copy_(ssm_state),
        "d_cache": alloc_like(tuple(d_cache.shape), ref=d_cache).copy_(d_cache),
        "k_cache": alloc_like(tuple(k_cache.shape), ref=k_cache).copy_(k_cache),
        "g_cache": alloc_like(tuple(g_cache.shape), ref=g_cache).copy_(g_cache),
    }


def _states() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 1, 4, 4).bfloat16(),
        -torch.rand(2, 2, 4, 4),
    )


def build_fork() -> dict[str, torch.Tensor]:
    return fork_states(*_states())


def build_fork_fp32_gates() -> dict[str, torch.Tensor]:
    return fork_states_fp32_gates(*_states())
