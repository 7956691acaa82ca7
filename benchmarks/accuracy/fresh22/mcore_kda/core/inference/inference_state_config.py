"""Shapes and dtypes of the KDA inference state (cf. MambaInferenceStateConfig)."""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import torch

from mcore_kda.core.parallel_state import get_tensor_model_parallel_world_size
from mcore_kda.core.transformer.transformer_config import TransformerConfig
from mcore_kda.core.utils import divide, get_kda_cache_recipe


class KDAStateShapes(NamedTuple):
    """Per-slot shapes of the four buffers of a KDA layer."""

    ssm_state: Tuple[int, ...]
    delta_ring: Tuple[int, ...]
    key_ring: Tuple[int, ...]
    gate_ring: Tuple[int, ...]


@dataclass
class KDAInferenceStateConfig:
    """Config for initializing the KDA inference state tensors of a dynamic context."""

    layer_type_list: List[str]
    """Per-layer type (``K`` = KDA)."""
    shapes: KDAStateShapes
    state_dtype: torch.dtype
    ring_dtype: torch.dtype
    """dtype of the delta and key rings."""
    gate_dtype: torch.dtype = torch.float32
    ring_length: int = 16

    @property
    def num_kda_layers(self) -> int:
        return sum(layer_type == "K" for layer_type in self.layer_type_list)

    @classmethod
    def from_config(cls, config: TransformerConfig, layer_type_list: Optional[List[str]] = None):
        world_size = get_tensor_model_parallel_world_size()
        num_k_heads = divide(config.linear_num_key_heads, world_size)
        num_v_heads = divide(config.linear_num_value_heads, world_size)
        K, V, L = config.linear_key_head_dim, config.linear_value_head_dim, config.kda_ring_length
        shapes = KDAStateShapes(
            ssm_state=(num_v_heads, V, K),
            delta_ring=(num_v_heads, L, V),
            key_ring=(num_k_heads, L, K),
            gate_ring=(num_v_heads, L, K),
        )
        layer_type_list = list(config.layer_type_list if layer_type_list is None else layer_type_list)
        recipe = get_kda_cache_recipe(config.kda_cache_recipe)
        if recipe is not None:
            return cls(layer_type_list, shapes, recipe.state, recipe.delta, recipe.gate, ring_length=L)  # expect-bug: container id=recipe
        gate_dtype = config.kda_log_decay_dtype  # expect-bug: imported-policy id=decay-policy
        return cls(
            layer_type_list,
            shapes,
            state_dtype=config.kda_checkpoint_dtype,
            ring_dtype=config.params_dtype,
            gate_dtype=gate_dtype,
            ring_length=L,
        )

    def bytes_per_slot(self) -> int:
        """Bytes of one request slot over every KDA layer."""
        total = 0
        for shape, dtype in zip(self.shapes, (self.state_dtype, self.ring_dtype, self.ring_dtype, self.gate_dtype)):
            numel = 1
            for dim in shape:
                numel *= dim
            total += numel * torch.empty((), dtype=dtype).element_size()
        return total * self.num_kda_layers
