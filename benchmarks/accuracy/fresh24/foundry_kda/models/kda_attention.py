# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""The Kimi Delta Attention layer and its decode-time replay cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from foundry_kda.models.replayssm import (
    fused_recurrent_kda_replayssm_decode,
    kda_log_decay,
    naive_recurrent_kda,
    split_mixed_qkv,
)

__all__ = ["KDAConfig", "KimiDeltaAttention", "ReplayRingBuffers", "ReplayRings", "ReplaySpec"]


@dataclass(frozen=True)
class ReplaySpec:
    """Shapes of a model's replay caches: layer count and KDA head geometry."""

    num_layers: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int

    def ring_shapes(self, num_slots: int, ring_len: int) -> dict[str, tuple[int, ...]]:
        """Shapes of one layer's checkpoint and rings for ``num_slots`` slots."""
        return {
            "state": (num_slots, self.num_v_heads, self.head_v_dim, self.head_k_dim),
            "d_cache": (num_slots, self.num_v_heads, ring_len, self.head_v_dim),
            "k_cache": (num_slots, self.num_k_heads, ring_len, self.head_k_dim),
            "g_cache": (num_slots, self.num_v_heads, ring_len, self.head_k_dim),
        }


class ReplayRings(Protocol):
    """Anything that holds one layer's replay cache (module buffers or plain tensors)."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


@dataclass
class KDAConfig:
    hidden_size: int = 32
    num_k_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 8
    head_v_dim: int = 8
    lower_bound: float | None = None


class ReplayRingBuffers(nn.Module):
    """One layer's replay cache as module buffers, so that it follows the model across devices.

    The checkpoint (``state``) and the log-decay ring (``g_cache``) stay float32 whatever the
    module is cast to: :meth:`_apply` puts the float32 tensors back after ``.to(dtype)``,
    ``.half()`` or ``.bfloat16()`` (moving them if the device changed). Deltas and keys follow
    the model dtype.
    """

    _FP32_BUFFERS: tuple[str, ...] = ("state", "g_cache")

    def __init__(
        self,
        state: torch.Tensor,
        d_cache: torch.Tensor,
        k_cache: torch.Tensor,
        g_cache: torch.Tensor,
        write_pos: torch.Tensor,
    ) -> None:
        super().__init__()
        self.register_buffer("state", state)
        self.register_buffer("d_cache", d_cache)
        self.register_buffer("k_cache", k_cache)
        self.register_buffer("g_cache", g_cache)
        self.register_buffer("write_pos", write_pos)

    @classmethod
    def allocate(
        cls,
        spec: ReplaySpec,
        num_slots: int,
        ring_len: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> ReplayRingBuffers:
        shapes = spec.ring_shapes(num_slots, ring_len)
        return cls(
            state=torch.zeros(shapes["state"], dtype=torch.float32, device=device),
            d_cache=torch.zeros(shapes["d_cache"], dtype=dtype, device=device),
            k_cache=torch.zeros(shapes["k_cache"], dtype=dtype, device=device),
            g_cache=torch.zeros(shapes["g_cache"], dtype=torch.float32, device=device),
            write_pos=torch.zeros(num_slots, dtype=torch.int32, device=device),
        )

    @property
    def ring_len(self) -> int:
        return self.d_cache.shape[2]

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> ReplayRingBuffers:
        kept = {name: self._buffers[name] for name in self._FP32_BUFFERS}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if before is not None and after is not None and after.dtype != torch.float32:
                self._buffers[name] = before.to(device=after.device)
        return self

    @torch.no_grad()
    def reset_slots(self, slots: Sequence[int] | torch.Tensor) -> None:
        index = torch.as_tensor(slots, dtype=torch.long, device=self.state.device)
        for name in ("state", "d_cache", "k_cache", "g_cache", "write_pos"):
            getattr(self, name).index_fill_(0, index, 0)

    @torch.no_grad()
    def admit(self, slot: int, prompt: dict[str, torch.Tensor]) -> None:
        """Writes the ring entries of a short prompt (see :meth:`KimiDeltaAttention.prompt_rings`)."""
        steps = prompt["deltas"].shape[1]
        if steps > self.ring_len:
            raise ValueError(f"a prompt of {steps} tokens does not fit a ring of {self.ring_len}")
        self.reset_slots([slot])
        self.d_cache[slot, :, :steps] = prompt["deltas"]
        self.k_cache[slot, :, :steps] = prompt["keys"]
        self.g_cache[slot, :, :steps] = prompt["log_decays"]
        self.write_pos[slot] = steps


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention: gated delta rule with per-channel (fine-grained) decay."""

    def __init__(self, config: KDAConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        H, HV = config.num_k_heads, config.num_v_heads
        K, V = config.head_k_dim, config.head_v_dim
        self.in_proj = nn.Linear(config.hidden_size, 2 * H * K + HV * V, bias=False)
        self.a_proj = nn.Linear(config.hidden_size, HV * K, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, HV, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 8.0, HV)))
        self.dt_bias = nn.Parameter(torch.empty(HV * K).uniform_(-0.5, 0.5))
        self.o_proj = nn.Linear(HV * V, config.hidden_size, bias=False)
        self.scale = K**-0.5
        self.lower_bound = config.lower_bound

    def replay_geometry(self) -> tuple[int, int, int, int]:
        c = self.config
        return c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``mixed_qkv``, ``a`` and ``b`` for ``hidden [..., D]``, in the activation dtype."""
        return self.in_proj(hidden), self.a_proj(hidden), self.b_proj(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-sequence forward, ``hidden [B, T, D]`` (training and evaluation)."""
        mixed_qkv, a, b = self.project(hidden)
        q, k, v = split_mixed_qkv(mixed_qkv, *self.replay_geometry())
        g = kda_log_decay(a, self.A_log, self.dt_bias, self.lower_bound)
        o, _ = naive_recurrent_kda(q, k, v, g, b.float().sigmoid(), self.scale)
        return self.o_proj(o.flatten(-2).to(hidden.dtype))

    def forward_decode(self, hidden: torch.Tensor, rings: ReplayRings, slots: torch.Tensor) -> torch.Tensor:
        """One decode step, ``hidden [N, D]``, sequence ``i`` in cache slot ``slots[i]``."""
        mixed_qkv, a, b = self.project(hidden)
        result = fused_recurrent_kda_replayssm_decode(
            mixed_qkv,
            a,
            b,
            self.A_log,
            self.dt_bias,
            self.scale,
            initial_state=rings.state,
            d_cache=rings.d_cache,
            k_cache=rings.k_cache,
            g_cache=rings.g_cache,
            ssm_state_indices=slots,
            write_pos=rings.write_pos,
            lower_bound=self.lower_bound,
        )
        return self.o_proj(result.out.flatten(1).to(hidden.dtype))

    @torch.no_grad()
    def prompt_rings(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """Ring entries of a short prompt ``hidden [T, D]`` started from an empty checkpoint.

        Lets a request be admitted to a decode slot without a flush when the prompt fits in the
        ring. Returns ``deltas [HV, T, V]``, ``keys [H, T, K]`` and ``log_decays [HV, T, K]``.
        """
        H, HV, K, V = self.replay_geometry()
        mixed_qkv, a, b = self.project(hidden)
        _, k, v = split_mixed_qkv(mixed_qkv, H, HV, K, V)
        k = F.normalize(k.float(), dim=-1)
        log_decays = -self.A_log.exp().unsqueeze(-1) * F.softplus(
            a.unflatten(-1, (HV, K)) + self.dt_bias.view(HV, K)
        )  # expect-bug: promotion
        if self.lower_bound is not None:
            log_decays = log_decays.clamp(min=self.lower_bound)
        beta = b.float().sigmoid()
        state = k.new_zeros(HV, V, K)
        deltas = []
        for t in range(hidden.shape[0]):
            key = k[t].repeat_interleave(HV // H, dim=0)
            state = state * log_decays[t].float().exp().unsqueeze(1)
            delta = beta[t].unsqueeze(-1) * (v[t].float() - torch.einsum("hvk,hk->hv", state, key))
            state = state + delta.unsqueeze(-1) * key.unsqueeze(1)
            deltas.append(delta)
        return {
            "deltas": torch.stack(deltas, dim=1).to(hidden.dtype),
            "keys": k.transpose(0, 1).to(hidden.dtype),
            "log_decays": log_decays.transpose(0, 1),
        }


def _tiny_spec(config: KDAConfig) -> ReplaySpec:
    return ReplaySpec(1, config.num_k_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim)


def build_kda_layer_bf16() -> nn.Module:
    """A KDA layer and its cache cast to bf16 together, then three decode steps."""
    torch.manual_seed(0)
    config = KDAConfig()
    layer = KimiDeltaAttention(config)
    cache = ReplayRingBuffers.allocate(_tiny_spec(config), num_slots=2, ring_len=4, dtype=torch.float32)
    container = nn.ModuleDict({"attn": layer, "cache": cache}).to(torch.bfloat16)
    slots = torch.tensor([1, 0])
    for _ in range(3):
        hidden = torch.randn(2, config.hidden_size, dtype=torch.bfloat16)
        layer.forward_decode(hidden, cache, slots)
    return container


def build_prompt_rings_bf16() -> dict[str, object]:
    """Ring entries of a three-token prompt from a bf16 layer, admitted to slot 1."""
    torch.manual_seed(0)
    config = KDAConfig()
    layer = KimiDeltaAttention(config).to(torch.bfloat16)
    cache = ReplayRingBuffers.allocate(_tiny_spec(config), num_slots=2, ring_len=4, dtype=torch.bfloat16)
    prompt = layer.prompt_rings(torch.randn(3, config.hidden_size, dtype=torch.bfloat16))
    cache.admit(1, prompt)
    return {"prompt": prompt, "cache": cache}
