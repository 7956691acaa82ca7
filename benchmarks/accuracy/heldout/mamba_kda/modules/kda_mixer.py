"""KDA mixer with a ReplaySSM decode state (layout of mamba_ssm's modules/)."""

from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..utils.generation import InferenceParams

STEP_ARGS: dict[str, torch.Tensor] = {}


def kda_chunk_replayssm_decode(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: Optional[torch.Tensor],
    scale: float, ssm_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    decay_cache: torch.Tensor, out: torch.Tensor,
) -> torch.Tensor:
    STEP_ARGS.update(ssm_state=ssm_state, d_cache=d_cache, k_cache=k_cache, decay_cache=decay_cache)
    return out


class KDAMixer(nn.Module):
    def __init__(self, d_model: int, headdim: int = 4, ring: int = 4, layer_idx: Optional[int] = None,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model, self.headdim, self.ring, self.layer_idx = d_model, headdim, ring, layer_idx
        self.nheads = d_model // headdim
        self.in_proj = nn.Linear(d_model, d_model, bias=False, **factory_kwargs)
        self.A_log = nn.Parameter(torch.zeros(self.nheads, device=device, dtype=torch.float32))

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None,
                                 **kwargs: Any) -> tuple[torch.Tensor, ...]:
        device = self.in_proj.weight.device
        dtype = self.in_proj.weight.dtype if dtype is None else dtype
        shapes = (
            (batch_size, self.nheads, self.headdim, self.headdim),
            (batch_size, self.nheads, self.ring, self.headdim),
            (batch_size, 1, self.ring, self.headdim),
            (batch_size, self.nheads, self.ring, self.headdim),
        )
        ssm_state, d_cache, k_cache, decay_cache = (
            torch.zeros(shape, device=device, dtype=dtype) for shape in shapes  # expect-bug: pool-dtype
        )
        return ssm_state, d_cache, k_cache, decay_cache

    def _get_states_from_cache(self, inference_params: InferenceParams, batch_size: int) -> tuple[torch.Tensor, ...]:
        assert self.layer_idx is not None
        if self.layer_idx not in inference_params.key_value_memory_dict:
            weight = self.in_proj.weight
            ssm_state = torch.zeros(batch_size, self.nheads, self.headdim, self.headdim, device=weight.device, dtype=weight.dtype)
            d_cache = torch.zeros(batch_size, self.nheads, self.ring, self.headdim, device=weight.device, dtype=weight.dtype)
            k_cache = torch.zeros(batch_size, 1, self.ring, self.headdim, device=weight.device, dtype=weight.dtype)
            decay_cache = torch.zeros_like(d_cache)  # expect-bug: like
            inference_params.key_value_memory_dict[self.layer_idx] = (ssm_state, d_cache, k_cache, decay_cache)
        return inference_params.key_value_memory_dict[self.layer_idx]

    def step(self, hidden_states: torch.Tensor, inference_params: InferenceParams) -> torch.Tensor:
        batch = hidden_states.shape[0]
        ssm_state, d_cache, k_cache, decay_cache = self._get_states_from_cache(inference_params, batch)
        x = self.in_proj(hidden_states.squeeze(1))
        out = torch.empty(batch, 1, self.nheads, self.headdim, dtype=x.dtype)
        kda_chunk_replayssm_decode(x, x, x, self.A_log, None, self.headdim**-0.5, ssm_state, d_cache, k_cache,
                                   decay_cache, out)
        return out


def decay_cache_from_dump(path: str, dtype: torch.dtype) -> torch.Tensor:
    """Loads a ring saved by the offline trace tool with np.save."""
    array = np.load(path, mmap_mode="r")
    decay_cache = torch.as_tensor(np.array(array), dtype=dtype)  # expect-bug: load
    return decay_cache


def decay_cache_from_dump_fp32(path: str) -> torch.Tensor:
    array = np.load(path, mmap_mode="r")
    decay_cache = torch.as_tensor(np.array(array), dtype=torch.float32)
    return decay_cache
