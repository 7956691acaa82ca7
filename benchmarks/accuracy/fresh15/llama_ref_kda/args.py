# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch

from .datatypes import DTYPE_BY_NAME, CacheDtype, QuantizationMode


@dataclass
class QuantizationArgs:
    mode: str = QuantizationMode.none.value
    group_size: int = 8
    # int4 weights are stored two to a byte; scales keep this dtype
    scale_dtype: str = "bf16"
    quantize_embeddings: bool = False


@dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 2
    # KDA heads: ``n_heads`` query/key heads, ``n_v_heads`` value heads (GQA when larger)
    n_heads: int = 2
    n_v_heads: Optional[int] = None
    head_dim: int = 8
    v_head_dim: Optional[int] = None
    vocab_size: int = 64
    multiple_of: int = 16  # make SwiGLU hidden layer size multiple of large power of 2
    ffn_dim_multiplier: Optional[float] = None
    norm_eps: float = 1e-5

    # gate: unbounded -A * softplus(x), or lower_bound * sigmoid(A * x) when set
    gate_lower_bound: Optional[float] = None
    use_qk_l2norm: bool = True

    # ReplaySSM cache: one checkpoint state and ``ring_len`` replay rows per slot
    ring_len: int = 4
    max_batch_size: int = 4
    max_seq_len: int = 64
    dtype: str = "bf16"
    cache_dtype: str = "bf16"
    logdecay_cache_dtype: str = "fp32"
    # allocate the caches while the layers are built (``setup_cache`` is then not needed)
    eager_cache: bool = False

    quantization_args: Optional[QuantizationArgs] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_v_heads is None:
            self.n_v_heads = self.n_heads
        if self.v_head_dim is None:
            self.v_head_dim = self.head_dim
        if isinstance(self.quantization_args, dict):
            self.quantization_args = QuantizationArgs(**self.quantization_args)
        assert self.n_v_heads % self.n_heads == 0, "n_v_heads must be a multiple of n_heads"
        assert self.ring_len >= 2, "a ring needs at least two rows"
        for name in ("dtype", "cache_dtype", "logdecay_cache_dtype"):
            CacheDtype(getattr(self, name))

    @classmethod
    def from_params(cls, params: Dict[str, Any], **overrides: Any) -> "ModelArgs":
        """``params.json`` contents; keys this class does not know go to ``extra``."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: v for k, v in params.items() if k in known}
        extra = {k: v for k, v in params.items() if k not in known}
        kwargs.update(overrides)
        return cls(**kwargs, extra=extra)

    @property
    def qkv_dim(self) -> int:
        return 2 * self.n_heads * self.head_dim + self.n_v_heads * self.v_head_dim

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]

    @property
    def quantization_mode(self) -> QuantizationMode:
        if self.quantization_args is None:
            return QuantizationMode.none
        return QuantizationMode(self.quantization_args.mode)
