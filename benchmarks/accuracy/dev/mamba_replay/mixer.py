"""KDA mixer with ReplaySSM decode state, in the shape of mamba_ssm's Mamba2 module."""

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .utils_generation import InferenceParams


def kda_replayssm_decode(*args: Any, **kwargs: Any) -> None:
    """Kernel binding (CPU stand-in): a decode step that only checks the ring layouts."""
    g_cache = kwargs.get("g_cache", args[9] if len(args) > 9 else None)
    assert g_cache is not None and g_cache.dim() == 4


class KDAMixer(nn.Module):
    def __init__(
        self,
        d_model: int,
        headdim: int = 4,
        ngroups: int = 1,
        ring_len: int = 4,
        layer_idx: Optional[int] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model = d_model
        self.headdim = headdim
        self.nheads = d_model // headdim
        self.ngroups = ngroups
        self.ring_len = ring_len
        self.layer_idx = layer_idx
        self.in_proj = nn.Linear(d_model, 2 * d_model, bias=False, **factory_kwargs)
        self.out_proj = nn.Linear(d_model, d_model, bias=False, **factory_kwargs)
        A = torch.empty(self.nheads, dtype=torch.float32, device=device).uniform_(1, 16)
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True

    def allocate_inference_cache(
        self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        device = self.out_proj.weight.device
        state_dtype = self.out_proj.weight.dtype if dtype is None else dtype
        ssm_state = torch.zeros(
            batch_size, self.nheads, self.headdim, self.headdim, device=device, dtype=state_dtype
        )
        d_cache = torch.zeros(
            batch_size, self.nheads, self.ring_len, self.headdim, device=device, dtype=state_dtype
        )
        k_cache = torch.zeros(
            batch_size, self.ngroups, self.ring_len, self.headdim, device=device, dtype=state_dtype
        )
        g_cache = torch.zeros(
            batch_size, self.nheads, self.ring_len, self.headdim, device=device, dtype=state_dtype  # expect-bug: pool-dtype
        )
        return ssm_state, d_cache, k_cache, g_cache

    def _get_states_from_cache(
        self, inference_params: InferenceParams, batch_size: int, initialize_states: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.layer_idx is not None
        if self.layer_idx not in inference_params.key_value_memory_dict:
            ssm_state = torch.zeros(
                batch_size, self.nheads, self.headdim, self.headdim,
                device=self.out_proj.weight.device, dtype=self.out_proj.weight.dtype,
            )
            d_cache = ssm_state.new_zeros(batch_size, self.nheads, self.ring_len, self.headdim)
            k_cache = ssm_state.new_zeros(batch_size, self.ngroups, self.ring_len, self.headdim)
            g_cache = ssm_state.new_zeros(batch_size, self.nheads, self.ring_len, self.headdim)  # expect-bug: like
            inference_params.key_value_memory_dict[self.layer_idx] = (ssm_state, d_cache, k_cache, g_cache)
        else:
            ssm_state, d_cache, k_cache, g_cache = inference_params.key_value_memory_dict[self.layer_idx]
            if initialize_states:
                ssm_state.zero_()
                d_cache.zero_()
                k_cache.zero_()
                g_cache.zero_()
        return ssm_state, d_cache, k_cache, g_cache

    def step(
        self, hidden_states: torch.Tensor, inference_params: InferenceParams
    ) -> torch.Tensor:
        batch = hidden_states.shape[0]
        ssm_state, d_cache, k_cache, g_cache = self._get_states_from_cache(inference_params, batch)
        xz = self.in_proj(hidden_states.squeeze(1))
        x, z = xz.chunk(2, dim=-1)
        out = torch.empty(batch, 1, self.nheads, self.headdim, dtype=x.dtype, device=x.device)
        kda_replayssm_decode(
            x, z, None, self.A_log, None, self.headdim**-0.5, ssm_state,
            d_cache, k_cache, g_cache, out,
        )
        return self.out_proj(out.view(batch, -1) * F.silu(z))


def gate_ring_from_numpy(path_or_array: "np.ndarray[Any, Any]", dtype: torch.dtype) -> torch.Tensor:
    """Warm-starts a ring from a dump written by the offline profiler (np.save / np.memmap)."""
    g_cache = torch.from_numpy(np.ascontiguousarray(path_or_array)).to(dtype)  # expect-bug: load
    return g_cache


def gate_ring_from_numpy_fp32(array: "np.ndarray[Any, Any]") -> torch.Tensor:
    g_cache = torch.from_numpy(np.asarray(array, dtype=np.float32))
    return g_cache
