"""A hybrid-model state pool for ReplaySSM KDA decode, as an inference engine would write it.

Full-attention layers use a paged KV cache (not shown); the KDA (linear-attention) layers keep, per
request slot, a checkpoint state plus three ring buffers that the ReplaySSM decode kernel replays:

    ssm_state [layers, slots, HV, V, K]   checkpoint, model or fp32 dtype
    d_cache   [layers, slots, HV, L, V]   deltas          -> model dtype
    k_cache   [layers, slots, H,  L, K]   keys            -> model dtype
    g_cache   [layers, slots, HV, L, K]   log-decays      -> ALWAYS float32

This file contains the gate-cache dtype bugs replaylint exists to catch. Run
``replaylint examples/`` to see them and ``replaylint --diff examples/`` for the fixes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class KDAPoolConfig:
    num_layers: int
    num_slots: int
    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    ring_len: int = 16
    dtype: torch.dtype = torch.bfloat16


class KDAReplayStatePool(nn.Module):
    """Per-slot recurrent state and ReplaySSM rings for every KDA layer."""

    def __init__(self, config: KDAPoolConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        c = config
        self.config = config
        self.ssm_state = torch.zeros(
            c.num_layers, c.num_slots, c.num_v_heads, c.head_v_dim, c.head_k_dim,
            dtype=torch.float32, device=device,
        )
        self.d_cache = torch.zeros(
            c.num_layers, c.num_slots, c.num_v_heads, c.ring_len, c.head_v_dim,
            dtype=c.dtype, device=device,
        )
        self.k_cache = torch.zeros(
            c.num_layers, c.num_slots, c.num_heads, c.ring_len, c.head_k_dim,
            dtype=c.dtype, device=device,
        )
        # The gate ring was copy-pasted from the lines above and hard-coded to bf16.
        self.g_cache = torch.zeros(
            c.num_layers, c.num_slots, c.num_v_heads, c.ring_len, c.head_k_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.register_buffer(
            "write_pos", torch.zeros(c.num_slots, dtype=torch.int32, device=device)
        )

    def layer_cache(self, layer: int) -> dict[str, torch.Tensor]:
        """The views one KDA layer's decode step receives."""
        return {
            "ssm_state": self.ssm_state[layer],
            "d_cache": self.d_cache[layer],
            "k_cache": self.k_cache[layer],
            "g_cache": self.g_cache[layer],
        }


def allocate_draft_rings(config: KDAPoolConfig, device: str) -> dict[str, torch.Tensor]:
    """Rings for a speculative-decoding draft model, built with half precision everywhere."""
    c = config
    return {
        "d_cache": torch.empty(c.num_slots, c.num_v_heads, c.ring_len, c.head_v_dim,
                               dtype=torch.half, device=device),
        "k_cache": torch.empty(c.num_slots, c.num_heads, c.ring_len, c.head_k_dim,
                               dtype=torch.half, device=device),
        "g_cache": torch.empty(c.num_slots, c.num_v_heads, c.ring_len, c.head_k_dim,
                               dtype=torch.half, device=device),
    }


class SlotSnapshot:
    """Saves one slot's ReplaySSM state so that a preempted request can resume later."""

    def __init__(self, pool: KDAReplayStatePool, slot: int) -> None:
        # Snapshots are kept in host memory in the model dtype to save space ...
        self.d_cache = pool.d_cache[:, slot].to("cpu", copy=True)
        self.k_cache = pool.k_cache[:, slot].to("cpu", copy=True)
        # ... and the gate ring went along with them.
        self.replayssm_g = pool.g_cache[:, slot].new_zeros(
            pool.g_cache[:, slot].shape, dtype=torch.bfloat16
        )
        self.replayssm_g.copy_(pool.g_cache[:, slot])
