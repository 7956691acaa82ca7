"""Shared fixtures for the guard tests (torch is imported lazily: a torch-less run still collects)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _sglang_decode(
    mixed_qkv: Any,
    a: Any,
    b: Any,
    A_log: Any,
    dt_bias: Any,
    scale: Any,
    initial_state: Any,
    d_cache: Any,
    k_cache: Any,
    g_cache: Any,
    out: Any,
    ssm_state_indices: Any,
    write_pos: Any,
    force_flush: Any = None,
    use_qk_l2norm_in_kernel: bool = False,
    lower_bound: float | None = None,
) -> tuple[Any, Any]:
    """Stand-in for the ReplaySSM decode kernel: writes g_cache[0, 0, 0] = 5 and `out` in place."""
    g_cache[0, 0, 0, :] = a.sum() + 1.0
    out.add_(g_cache.sum())
    return out, initial_state


def _sglang_arguments(g_dtype: Any = None) -> list[Any]:
    torch = pytest.importorskip("torch")
    return [
        torch.zeros(2, 8),  # mixed_qkv
        torch.ones(2, 1, 2),  # a
        torch.zeros(2, 1),  # b
        torch.zeros(1),  # A_log
        torch.zeros(1, 2),  # dt_bias
        0.5,  # scale
        torch.zeros(3, 1, 2, 2),  # initial_state
        torch.zeros(3, 1, 4, 2),  # d_cache
        torch.zeros(3, 1, 4, 2),  # k_cache
        torch.zeros(3, 1, 4, 2, dtype=g_dtype or torch.float32),  # g_cache
        torch.zeros(2, 1, 1, 2),  # out
        torch.tensor([0, 1], dtype=torch.int32),  # ssm_state_indices
        torch.tensor([0, 0], dtype=torch.int32),  # write_pos
    ]


@pytest.fixture
def decode_fn() -> Callable[..., Any]:
    """An undecorated function with sglang's ReplaySSM decode signature (g_cache at index 9)."""
    return _sglang_decode


@pytest.fixture
def decode_args() -> Callable[..., list[Any]]:
    """Factory: the 13 required decode arguments, the gate cache of the given dtype (float32)."""
    return _sglang_arguments


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Forget which guard warnings were shown (for the process-wide keys of the loader)."""
    from replaylint.guards import _warn_once

    monkeypatch.setattr(_warn_once, "_emitted", set())
    return
