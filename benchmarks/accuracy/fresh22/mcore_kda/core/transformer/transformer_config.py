"""Configuration of KDA (Kimi Linear) models (cf. megatron/core/transformer/transformer_config.py)."""

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from ..utils import _DTYPE_FROM_STR, init_method_normal, scaled_init_method_normal, str_to_dtype


@dataclass
class ModelParallelConfig:
    """Parallelism and precision settings shared by every module."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False
    perform_initialization: bool = True
    use_cpu_initialization: bool = True
    fp16: bool = False
    """If true, train/serve with fp16 mixed precision (Float16Module)."""
    bf16: bool = False
    """If true, train/serve with bf16 mixed precision (Float16Module)."""
    params_dtype: torch.dtype = torch.float32
    """dtype used when intializing the weights."""

    def __post_init__(self):
        if self.sequence_parallel and self.tensor_model_parallel_size <= 1:
            raise ValueError("Can not use sequence paralllelism without tensor parallelism")
        if self.fp16 and self.bf16:
            raise ValueError(f"Only one of self.fp16: {self.fp16} and self.bf16 {self.bf16} should be True.")


@dataclass
class TransformerConfig(ModelParallelConfig):
    """Configuration object for KDA stacks."""

    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    kv_channels: Optional[int] = None
    layernorm_epsilon: float = 1e-5
    init_method_std: float = 0.02
    init_method: Optional[Callable] = None
    output_layer_init_method: Optional[Callable] = None
    hybrid_override_pattern: Optional[str] = None
    """One character per layer: ``K`` for a KDA layer (the only kind this package builds)."""

    # Kimi Delta Attention
    linear_num_key_heads: int = 0
    linear_num_value_heads: Optional[int] = None
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    kda_gate_lower_bound: Optional[float] = None
    """Bounded gate g = lb * sigmoid(exp(A_log) * x) when set (Kimi K3 uses -5)."""
    kda_use_qk_l2norm: bool = True
    kda_ring_length: int = 16
    """Rows of the ReplaySSM rings; the checkpoint state is rewritten once per ``kda_ring_length`` steps."""
    kda_state_dtype: Optional[str] = None
    """Precision of the checkpoint state (``"fp32"``, ``"bf16"``, ...); None: the params dtype."""
    kda_cache_recipe: Optional[str] = None
    """Name of a recipe in ``core.utils.KDA_CACHE_RECIPES``; overrides ``kda_state_dtype``."""
    kda_resident_inference_state: bool = False
    """Keep the decode state of each layer in module buffers (a static batch, CUDA-graph friendly)."""

    # inference
    inference_max_batch_size: int = 1
    enable_cuda_graph: bool = False
    cuda_graph_warmup_steps: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.num_attention_heads % self.tensor_model_parallel_size != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"tensor_model_parallel_size ({self.tensor_model_parallel_size})."
            )
        if self.kv_channels is None:
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.linear_num_value_heads is None:
            self.linear_num_value_heads = self.linear_num_key_heads
        if self.linear_num_value_heads % self.linear_num_key_heads != 0:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.kda_ring_length < 2:
            raise ValueError(f"kda_ring_length must be at least 2, got {self.kda_ring_length}")
        if self.kda_state_dtype is not None and self.kda_state_dtype not in _DTYPE_FROM_STR:
            raise ValueError(f"kda_state_dtype {self.kda_state_dtype!r} is not one of {sorted(_DTYPE_FROM_STR)}")
        if self.kda_gate_lower_bound is not None and self.kda_gate_lower_bound >= 0:
            raise ValueError("kda_gate_lower_bound must be negative")
        if self.init_method is None:
            self.init_method = init_method_normal(self.init_method_std)
        if self.output_layer_init_method is None:
            self.output_layer_init_method = scaled_init_method_normal(self.init_method_std, self.num_layers)
        if self.hybrid_override_pattern is None:
            self.hybrid_override_pattern = "K" * self.num_layers
        if len(self.hybrid_override_pattern) != self.num_layers:
            raise ValueError("hybrid_override_pattern must have one character per layer")

    @property
    def layer_type_list(self) -> List[str]:
        return list(self.hybrid_override_pattern)

    @property
    def kda_checkpoint_dtype(self) -> torch.dtype:
        """dtype of the checkpoint state ``S[slot, HV, V, K]``."""
        if self.kda_state_dtype is None:
            return self.params_dtype
        return str_to_dtype(self.kda_state_dtype)

    @property
    def kda_log_decay_dtype(self) -> torch.dtype:
        """dtype of the per-step log-decays kept in the gate ring."""
        # The ring is replayed on top of the checkpoint: keep both in the same precision.
        return self.kda_checkpoint_dtype  # expect-bug: imported-policy id=decay-policy
