"""The per-step context layers read their metadata and caches from (vllm/forward_context.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

from vllm_v1_kda.config import VllmConfig


@dataclass
class ForwardContext:
    no_compile_layers: dict[str, Any]
    """Copy of ``compilation_config.static_forward_context``: layer name -> layer."""
    attn_metadata: Optional[dict[str, Any]]
    """Layer name -> metadata of its backend; None during the profile run."""
    virtual_engine: int = 0
    num_tokens: Optional[int] = None
    cudagraph_runtime_mode: str = "NONE"


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, (
        "Forward context is not set. Please use `set_forward_context` to set the forward context."
    )
    return _forward_context


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: Optional[dict[str, Any]],
    vllm_config: VllmConfig,
    virtual_engine: int = 0,
    num_tokens: Optional[int] = None,
    cudagraph_runtime_mode: str = "NONE",
) -> Iterator[None]:
    global _forward_context
    prev_context = _forward_context
    _forward_context = ForwardContext(
        no_compile_layers=vllm_config.compilation_config.static_forward_context,
        attn_metadata=attn_metadata,
        virtual_engine=virtual_engine,
        num_tokens=num_tokens,
        cudagraph_runtime_mode=cudagraph_runtime_mode,
    )
    try:
        yield
    finally:
        _forward_context = prev_context
