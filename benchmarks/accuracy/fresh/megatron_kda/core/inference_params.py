from typing import NamedTuple

import torch

KDAState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(ssm_state, d_cache, k_cache, g_cache) of one layer."""


class InferenceParams:
    """Inference parameters that are passed to the main model in order
    to efficienly calculate and store the context during inference."""

    def __init__(self, max_batch_size: int, max_sequence_length: int):
        self.max_sequence_length = max_sequence_length
        self.max_batch_size = max_batch_size
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        self.key_value_memory_dict: dict[int, KDAState] = {}

    def swap_key_value_dict(self, batch_idx: torch.Tensor) -> None:
        "swap between batches"
        if len(self.key_value_memory_dict) == 0:
            raise ValueError("should not swap when dict in empty")

        for layer_number in self.key_value_memory_dict:
            ssm_state, d_cache, k_cache, g_cache = self.key_value_memory_dict[layer_number]
            assert len(batch_idx) == ssm_state.shape[0]  # make sure batch size is the same
            states = (
                ssm_state[batch_idx],
                d_cache[batch_idx],
                k_cache[batch_idx],
                g_cache[batch_idx],
            )
            self.key_value_memory_dict[layer_number] = states

    def expand_for_beams(self, beam_size: int) -> None:
        """Repeats every sequence's state ``beam_size`` times (beam search after the prompt)."""
        for layer_number, states in list(self.key_value_memory_dict.items()):
            ssm_state, d_cache, k_cache, g_cache = states
            batch = ssm_state.shape[0] * beam_size
            new_ssm_state = ssm_state.new_empty((batch, *ssm_state.shape[1:]))
            new_d_cache = d_cache.new_empty((batch, *d_cache.shape[1:]))
            new_k_cache = k_cache.new_empty((batch, *k_cache.shape[1:]))
            new_g_cache = d_cache.new_empty((batch, *g_cache.shape[1:]))  # expect-bug: like
            new_states = (new_ssm_state, new_d_cache, new_k_cache, new_g_cache)
            for new, old in zip(new_states, states, strict=True):
                new.copy_(old.repeat_interleave(beam_size, dim=0))
            self.key_value_memory_dict[layer_number] = new_states
        self.max_batch_size *= beam_size


class KDAStateSpec(NamedTuple):
    """Shapes and dtypes of one layer's ReplaySSM decode state."""

    num_heads: int
    num_k_heads: int
    head_dim: int
    ring_len: int
    state_dtype: torch.dtype = torch.float32
    ring_dtype: torch.dtype = torch.bfloat16
    gate_dtype: torch.dtype = torch.bfloat16  # expect-bug: container id=mg-state-spec


def allocate_kda_state(
    spec: KDAStateSpec, batch_size: int, device: torch.device | None = None
) -> KDAState:
    h, hk, d, n = spec.num_heads, spec.num_k_heads, spec.head_dim, spec.ring_len
    ssm_state = torch.zeros(batch_size, h, d, d, dtype=spec.state_dtype, device=device)
    d_cache = torch.zeros(batch_size, h, n, d, dtype=spec.ring_dtype, device=device)
    k_cache = torch.zeros(batch_size, hk, n, d, dtype=spec.ring_dtype, device=device)
    g_cache = torch.zeros(  # expect-bug: container id=mg-state-spec
        batch_size, h, n, d, dtype=spec.gate_dtype, device=device
    )
    return ssm_state, d_cache, k_cache, g_cache


def named_states(inference_params: InferenceParams) -> dict[str, torch.Tensor]:
    """``layer{n}.{name}`` -> tensor, for logging and tests."""
    names = ("ssm_state", "d_cache", "k_cache", "g_cache")
    return {
        f"layer{layer_number}.{name}": tensor
        for layer_number, states in inference_params.key_value_memory_dict.items()
        for name, tensor in zip(names, states, strict=True)
    }


def _states(ring_dtype: torch.dtype) -> KDAState:
    spec = KDAStateSpec(2, 1, 4, 4, ring_dtype=ring_dtype, gate_dtype=torch.float32)
    ssm_state, d_cache, k_cache, g_cache = allocate_kda_state(spec, batch_size=2)
    d_cache.normal_()
    k_cache.normal_()
    g_cache.uniform_(-1.0, 0.0)
    return ssm_state, d_cache, k_cache, g_cache


def build_swapped_states() -> dict[str, torch.Tensor]:
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    params.key_value_memory_dict = {1: _states(torch.bfloat16), 2: _states(torch.bfloat16)}
    params.swap_key_value_dict(torch.tensor([1, 0]))
    return named_states(params)


def build_beam_expanded() -> dict[str, torch.Tensor]:
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    params.key_value_memory_dict = {1: _states(torch.float16)}
    params.expand_for_beams(beam_size=2)
    return named_states(params)


def build_state_from_spec_defaults() -> dict[str, torch.Tensor]:
    spec = KDAStateSpec(num_heads=2, num_k_heads=1, head_dim=4, ring_len=4)
    params = InferenceParams(max_batch_size=1, max_sequence_length=16)
    params.key_value_memory_dict[1] = allocate_kda_state(spec, batch_size=1)
    return named_states(params)


def build_state_from_spec_fp16_rings() -> dict[str, torch.Tensor]:
    spec = KDAStateSpec(2, 1, 4, 4, torch.float32, torch.float16, torch.float32)
    params = InferenceParams(max_batch_size=1, max_sequence_length=16)
    params.key_value_memory_dict[1] = allocate_kda_state(spec, batch_size=1)
    return named_states(params)
