"""Copies a cached prefix's layer states into a new request's slot."""

import torch

from .utils.generation import empty_state


def clone_layer_states(states: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    ssm_state, d_cache, k_cache, decay_cache = states
    new_ssm = empty_state(tuple(ssm_state.shape), ssm_state).copy_(ssm_state)
    new_d = empty_state(tuple(d_cache.shape), d_cache).copy_(d_cache)
    new_k = empty_state(tuple(k_cache.shape), k_cache).copy_(k_cache)
    new_decay_cache = empty_state(tuple(decay_cache.shape), new_d).copy_(decay_cache)  # expect-bug: imported-policy
    return {"ssm_state": new_ssm, "d_cache": new_d, "k_cache": new_k, "decay_cache": new_decay_cache}


def clone_layer_states_fp32(states: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    names = ("ssm_state", "d_cache", "k_cache", "decay_cache")
    return {name: empty_state(tuple(t.shape), t).copy_(t) for name, t in zip(names, states, strict=True)}


def _states() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 2, 4, 4).bfloat16(),
        torch.randn(2, 1, 4, 4).bfloat16(),
        -torch.rand(2, 2, 4, 4),
    )


def build_clone_states() -> dict[str, torch.Tensor]:
    return clone_layer_states(_states())


def build_clone_states_fp32() -> dict[str, torch.Tensor]:
    return clone_layer_states_fp32(_states())
