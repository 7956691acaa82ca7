"""Kimi-Linear model configuration, reduced to the fields the KDA decode path reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..compat import PretrainedConfig

_STR_TO_TORCH_DTYPE = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


class KimiLinearConfig(PretrainedConfig):
    r"""Configuration of a Kimi-Linear checkpoint whose layers are all KDA layers.

    Args:
        num_attention_heads: query/key heads (``H``).
        num_value_heads: value heads (``HV``); a multiple of ``num_attention_heads``.
        head_dim / v_head_dim: ``K`` and ``V``.
        replay_ring_len: rows per ReplaySSM ring (``L``); the checkpoint state is rewritten
            every ``L`` decode steps.
        kda_lower_bound: bounded gate ``lb * sigmoid(A * x)`` when set (a negative float).
        max_batch_size: cache slots allocated per layer.
    """

    model_type = "kimi_linear"

    def __init__(
        self,
        vocab_size: int = 64,
        hidden_size: int = 32,
        intermediate_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 2,
        num_value_heads: int = 4,
        head_dim: int = 8,
        v_head_dim: int = 8,
        replay_ring_len: int = 4,
        kda_lower_bound: Optional[float] = None,
        rms_norm_eps: float = 1e-6,
        max_batch_size: int = 3,
        torch_dtype: str = "bfloat16",
        **kwargs,
    ) -> None:
        super().__init__(torch_dtype=torch_dtype, **kwargs)
        if num_value_heads % num_attention_heads:
            raise ValueError(
                f"num_value_heads ({num_value_heads}) must be a multiple of num_attention_heads ({num_attention_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_value_heads = num_value_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim
        self.replay_ring_len = replay_ring_len
        self.kda_lower_bound = kda_lower_bound
        self.rms_norm_eps = rms_norm_eps
        self.max_batch_size = max_batch_size

    @property
    def model_torch_dtype(self) -> torch.dtype:
        """dtype of the weights, the checkpoint state and the delta/key rings."""
        return _STR_TO_TORCH_DTYPE[self.torch_dtype]

    @property
    def alpha_log_torch_dtype(self) -> torch.dtype:
        """dtype of the log-decay ring; prefix sums of it are exponentiated by the kernel."""
        return torch.float32

    @property
    def mixed_qkv_dim(self) -> int:
        return 2 * self.num_attention_heads * self.head_dim + self.num_value_heads * self.v_head_dim

    def ring_shapes(self, num_slots: int) -> dict[str, tuple[int, ...]]:
        h, hv = self.num_attention_heads, self.num_value_heads
        k, v, ring = self.head_dim, self.v_head_dim, self.replay_ring_len
        return {
            "state": (num_slots, hv, v, k),
            "delta": (num_slots, hv, ring, v),
            "key": (num_slots, h, ring, k),
            "alpha_log": (num_slots, hv, ring, k),
        }


@dataclass(frozen=True)
class KDACacheSpec:
    """Per-ring dtypes of one layer's ReplaySSM cache."""

    state_dtype: torch.dtype
    delta_dtype: torch.dtype
    key_dtype: torch.dtype
    alpha_log_dtype: torch.dtype = torch.float32

    @classmethod
    def from_config(cls, config: KimiLinearConfig) -> "KDACacheSpec":
        dtype = config.model_torch_dtype
        return cls(state_dtype=dtype, delta_dtype=dtype, key_dtype=dtype)

    def dtype_of(self, ring: str) -> torch.dtype:
        return getattr(self, f"{ring}_dtype")


class OffloadRingDtypes(NamedTuple):
    """dtypes of the host copies a cache keeps for layers offloaded to CPU memory."""

    state: torch.dtype
    delta: torch.dtype
    key: torch.dtype
    alpha_log: torch.dtype = torch.bfloat16  # expect-bug: container

    @classmethod
    def for_config(cls, config: KimiLinearConfig) -> "OffloadRingDtypes":
        dtype = config.model_torch_dtype
        return cls(state=dtype, delta=dtype, key=dtype)
