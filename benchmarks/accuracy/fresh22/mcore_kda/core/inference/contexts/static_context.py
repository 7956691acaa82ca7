"""Static batching inference context (cf. megatron/core/inference/contexts/static_context.py)."""

from typing import Dict, NamedTuple, Optional

import torch

from ...ssm.replay_ops import next_write_pos
from .base_context import BaseInferenceContext


class KDAInferenceState(NamedTuple):
    """Decode state of one KDA layer for a batch of sequences (or slots)."""

    ssm_state: torch.Tensor
    """checkpoint state [b, HV, V, K]"""
    delta_ring: torch.Tensor
    """[b, HV, L, V]"""
    key_ring: torch.Tensor
    """[b, H, L, K]"""
    gate_ring: torch.Tensor
    """per-step log-decays [b, HV, L, K], float32"""


class StaticInferenceContext(BaseInferenceContext):
    """Inference parameters of a static batch, stored in a single class.

    ``key_value_memory_dict`` maps a layer number to that layer's :class:`KDAInferenceState`; it is
    filled by the first (prefill) forward pass, or in advance when the decode step is captured
    into CUDA graphs (the buffers must keep their addresses then).

    Args:
        max_batch_size (int): max supported batch size
        max_sequence_length (int): max supported sequence length
    """

    def __init__(self, max_batch_size: int, max_sequence_length: int):
        super().__init__(materialize_only_last_token_logits=True)
        self.max_sequence_length = max_sequence_length
        self.max_batch_size = max_batch_size
        self.current_batch_size = max_batch_size
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        self.key_value_memory_dict: Dict[int, KDAInferenceState] = {}
        self.kda_write_pos: Optional[torch.Tensor] = None
        self.decode_graph_runners: Dict[int, object] = {}

    @classmethod
    def from_config(cls, inference_config) -> "StaticInferenceContext":
        return cls(inference_config.max_batch_size, inference_config.max_sequence_length)

    def is_static_batching(self) -> bool:
        return True

    def is_decode_only(self) -> bool:
        """Functional access to `.decode_mode`, to match dynamic context."""
        return self.sequence_len_offset > 0

    def increment_sequence_len_offset(self, increment: int = 1) -> None:
        self.sequence_len_offset += increment

    def advance_kda_write_pos(self, ring_length: int) -> None:
        """Move every sequence's ring cursor past the token just decoded."""
        self.kda_write_pos = next_write_pos(self.kda_write_pos, ring_length)

    def swap_key_value_dict(self, batch_idx: torch.Tensor) -> None:
        """Reorder the batch of every layer (e.g. after a beam search step)."""
        if len(self.key_value_memory_dict) == 0:
            raise ValueError("should not swap when dict in empty")
        for layer_number in self.key_value_memory_dict.keys():
            cache = self.key_value_memory_dict[layer_number]
            assert len(batch_idx) == cache.ssm_state.shape[0]  # make sure batch size is the same
            self.key_value_memory_dict[layer_number] = KDAInferenceState(
                *(tensor.index_select(0, batch_idx) for tensor in cache)
            )
        self.kda_write_pos = self.kda_write_pos.index_select(0, batch_idx)

    def extend_batch(self, new_batch_size: int) -> None:
        """Grow the static batch in place of a restart; the new rows start from an empty state."""
        if new_batch_size > self.max_batch_size:
            raise ValueError(f"batch size {new_batch_size} is above max_batch_size {self.max_batch_size}")
        for layer_number, cache in self.key_value_memory_dict.items():
            batch = cache.ssm_state.shape[0]
            ssm_state = cache.ssm_state.new_zeros((new_batch_size, *cache.ssm_state.shape[1:]))
            delta_ring = cache.delta_ring.new_zeros((new_batch_size, *cache.delta_ring.shape[1:]))
            key_ring = cache.key_ring.new_zeros((new_batch_size, *cache.key_ring.shape[1:]))
            # gate rows are laid out as the delta rows (per value head), K channels wide
            gate_ring = cache.delta_ring.new_zeros((new_batch_size, *cache.gate_ring.shape[1:]))  # expect-bug: like
            grown = KDAInferenceState(ssm_state, delta_ring, key_ring, gate_ring)
            for new, old in zip(grown, cache):
                new[:batch] = old
            self.key_value_memory_dict[layer_number] = grown
        write_pos = torch.zeros(new_batch_size, dtype=torch.int32)
        write_pos[: self.kda_write_pos.shape[0]] = self.kda_write_pos
        self.kda_write_pos = write_pos
        self.current_batch_size = new_batch_size

    def reset(self) -> None:
        """Resets the inference state for a new batch."""
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        self.key_value_memory_dict.clear()
        self.kda_write_pos = None


def build_extended_batch():
    """A running bf16 batch of two prompts joined by a third sequence, then decoded further."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32")
    model = Float16Module(config, kimi_linear_model_provider(config))
    engine = make_static_engine(model, max_batch_size=3)
    tokens = engine.generate([[7, 3, 9, 1, 4, 4], [5, 2, 8, 8, 1, 0]], num_tokens_to_generate=3)
    context = engine.inference_context
    context.extend_batch(3)
    last = torch.cat([tokens[:, -1], torch.tensor([11])])
    more = engine.controller.decode_static_batch(last, num_tokens_to_generate=2)
    return {"tokens": tokens, "more_tokens": more, "memory": context.key_value_memory_dict,
            "write_pos": context.kda_write_pos}
