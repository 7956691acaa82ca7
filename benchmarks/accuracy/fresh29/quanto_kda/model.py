"""A small KDA model and its replay-ring caches: ``KDALayerCache`` modules attached by
``setup_caches`` (buffers, saved with the model) or dicts per layer with the keys ``state``,
``d_ring``, ``k_ring`` and ``log_decay_q`` (``allocate_inference_cache``, ``prefill``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import fused_recurrent_kda_replayssm_decode, last_inputs
from .utils import default_dtype


@dataclass
class KDAConfig:
    vocab_size: int = 16
    hidden_size: int = 8
    num_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 2
    head_k_dim: int = 4
    head_v_dim: int = 4
    ring_length: int = 3
    gate_lower_bound: float | None = None


def ring_shapes(config: KDAConfig, slots: int) -> dict[str, tuple[int, ...]]:
    H, HV, L, K, V = config.num_heads, config.num_v_heads, config.ring_length, config.head_k_dim, config.head_v_dim
    return {"state": (slots, HV, V, K), "d": (slots, HV, L, V), "k": (slots, H, L, K), "g": (slots, HV, L, K)}


class RingSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16  # expect-bug: container id=ring-spec


def ring_specs(config: KDAConfig, slots: int, dtype: torch.dtype) -> tuple[RingSpec, ...]:
    shapes = ring_shapes(config, slots)
    return (RingSpec("state", shapes["state"], torch.float32), RingSpec("d_ring", shapes["d"], dtype), RingSpec("k_ring", shapes["k"], dtype), RingSpec("log_decay_q", shapes["g"]))  # expect-bug: container id=ring-spec


def push_rows(rings, slot_ids: torch.Tensor, rows) -> None:
    """Shift each ring of ``slot_ids`` one step and write the new row last (in place)."""
    for ring, row in zip(rings, rows):
        ring[slot_ids] = torch.cat([ring[slot_ids, :, 1:], row[:, :, None].to(ring.dtype)], dim=2)


class KDALayerCache(nn.Module):
    def __init__(self, config: KDAConfig, slots: int, dtype: torch.dtype | None = None):
        super().__init__()
        shapes = ring_shapes(config, slots)
        self.register_buffer("state", torch.zeros(shapes["state"], dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(shapes["d"], dtype=dtype))
        self.register_buffer("k_cache", torch.zeros(shapes["k"], dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(shapes["g"]))  # expect-bug: default-dtype id=from-config
        self.register_buffer("slot_steps", torch.zeros(slots, dtype=torch.int32))

    def adopt(self, rings: dict[str, torch.Tensor]) -> None:
        """Take a prefill's rings (one row per slot) as this cache's storage."""
        self.state = rings["state"].float()
        self.d_cache = rings["d_ring"].to(self.d_cache.dtype)
        self.k_cache = rings["k_ring"].to(self.k_cache.dtype)
        self.g_cache = rings["log_decay_q"].to(self.d_cache.dtype)  # expect-bug: cast


class FP32GateLayerCache(KDALayerCache):
    """Keeps ``state`` and ``g_cache`` in float32 through ``model.to(dtype)``/``.half()``."""

    keep_in_fp32 = ("state", "g_cache")

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in self.keep_in_fp32}
        super()._apply(fn, recurse)
        device = self._buffers["d_cache"].device
        for name, tensor in kept.items():
            self._buffers[name] = tensor.to(device=device)
        return self


class KDAAttention(nn.Module):
    def __init__(self, config: KDAConfig, dtype: torch.dtype | None = None):
        super().__init__()
        c = self.config = config
        H, HV, K, V = c.num_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim
        linear = functools.partial(nn.Linear, bias=False, dtype=dtype)
        self.q_proj, self.k_proj = linear(c.hidden_size, H * K), linear(c.hidden_size, H * K)
        self.v_proj, self.g_proj = linear(c.hidden_size, HV * V), linear(c.hidden_size, HV * K)
        self.b_proj, self.o_proj = linear(c.hidden_size, HV), linear(HV * V, c.hidden_size)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, HV + 1, dtype=torch.float32)))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, HV * K, dtype=torch.float32))
        bound = c.gate_lower_bound
        self.register_buffer("lower_bound", None if bound is None else torch.tensor(bound, dtype=torch.float32))
        self.cache: KDALayerCache | None = None

    def project(self, x: torch.Tensor):
        c, (B, T, _) = self.config, x.shape
        q = self.q_proj(x).view(B, T, c.num_heads, c.head_k_dim)
        k = self.k_proj(x).view(B, T, c.num_heads, c.head_k_dim)
        v = self.v_proj(x).view(B, T, c.num_v_heads, c.head_v_dim)
        g = self.g_proj(x).view(B, T, c.num_v_heads, c.head_k_dim)
        return q, k, v, g, torch.sigmoid(self.b_proj(x))

    def gate_step(self, g: torch.Tensor) -> torch.Tensor:
        """Per-step log-decay [B, HV, K] in float32."""
        if self.lower_bound is not None:
            return self.lower_bound.float() * torch.sigmoid(g.float())
        return -self.A_log.float().exp()[:, None] * F.softplus(g.float() + self.dt_bias.float().view(g.shape[-2:]))

    def prefill(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's rings after a prompt: the last ``ring_length`` steps and the state."""
        q, k, v, g, beta = self.project(hidden)
        c, tail = self.config, slice(-self.config.ring_length, None)
        delta = beta[..., None] * v
        keys = k.repeat_interleave(c.num_v_heads // c.num_heads, dim=2)
        state = torch.einsum("bthv,bthk->bhvk", delta.float(), keys.float())
        g_tail = g[:, tail].transpose(1, 2)
        if self.lower_bound is not None:
            log_decay_q = self.lower_bound * torch.sigmoid(g_tail)  # expect-bug: promotion
        else:
            log_decay_q = -self.A_log.exp().view(1, -1, 1, 1) * F.softplus(g_tail + self.dt_bias.view(1, c.num_v_heads, 1, -1))
        d_ring, k_ring = delta[:, tail].transpose(1, 2), k[:, tail].transpose(1, 2)
        return {"state": state, "d_ring": d_ring.contiguous(), "k_ring": k_ring.contiguous(), "log_decay_q": log_decay_q}

    def decode(self, hidden: torch.Tensor, cache, slot_ids: torch.Tensor) -> torch.Tensor:
        q, k, v, g_raw, beta = (x[:, 0] for x in self.project(hidden))
        g = self.gate_step(g_raw)
        if isinstance(cache, KDALayerCache):
            o = fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, initial_state=cache.state, initial_state_indices=slot_ids, d_cache=cache.d_cache, k_cache=cache.k_cache, g_cache=cache.g_cache, cache_steps=cache.slot_steps)
            push_rows((cache.d_cache, cache.k_cache, cache.g_cache), slot_ids, (beta[..., None] * v, k, g))
            cache.slot_steps[slot_ids] += 1
        else:
            o = fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, initial_state=cache["state"], initial_state_indices=slot_ids, d_cache=cache["d_ring"], k_cache=cache["k_ring"], g_cache=cache["log_decay_q"])
            push_rows((cache["d_ring"], cache["k_ring"], cache["log_decay_q"]), slot_ids, (beta[..., None] * v, k, g))
        return self.o_proj(o.reshape(o.shape[0], 1, -1))


class KDAModel(nn.Module):
    def __init__(self, config: KDAConfig, dtype: torch.dtype | None = None):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(KDAAttention(config, dtype) for _ in range(config.num_layers))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @classmethod
    def from_config(cls, config: KDAConfig, slots: int = 0, torch_dtype: torch.dtype | None = None) -> KDAModel:
        with default_dtype(torch_dtype or torch.float32):  # expect-bug: default-dtype id=from-config
            model = cls(config)
            if slots:
                model.setup_caches(slots)
        return model

    def setup_caches(self, slots: int, dtype: torch.dtype | None = None, cache_cls=KDALayerCache) -> None:
        for layer in self.layers:
            layer.cache = cache_cls(self.config, slots, dtype or self.dtype)

    def allocate_inference_cache(self, slots: int, dtype: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
        specs = ring_specs(self.config, slots, dtype or self.dtype)
        return [{spec.name: torch.zeros(spec.shape, dtype=spec.dtype) for spec in specs} for _ in self.layers]  # expect-bug: container id=ring-spec

    def prefill(self, input_ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        hidden = self.embed(input_ids)
        return [layer.prefill(hidden) for layer in self.layers]

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, slot_ids: torch.Tensor, caches=None) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            hidden = hidden + layer.decode(hidden, layer.cache if caches is None else caches[i], slot_ids)
        return hidden


TOKENS, PROMPT = torch.tensor([[3], [11]]), torch.arange(10).view(2, 5)

def build_model_decode_bf16():
    model = KDAModel(KDAConfig(), dtype=torch.bfloat16)
    model.setup_caches(slots=2)
    for _ in range(2):
        model.step(TOKENS, torch.tensor([1, 0], dtype=torch.int32))
    return {"model": model, "kernel": last_inputs()}

def build_from_config_bf16():
    model = KDAModel.from_config(KDAConfig(), slots=2, torch_dtype=torch.bfloat16)
    model.step(TOKENS, torch.arange(2))
    return model

def build_inference_cache_bf16():
    model = KDAModel(KDAConfig(), dtype=torch.bfloat16)
    caches = model.allocate_inference_cache(slots=2)
    model.step(TOKENS, torch.arange(2), caches)
    return caches

@torch.no_grad()
def build_softplus_prefill():
    return KDAModel(KDAConfig(), dtype=torch.bfloat16).prefill(PROMPT)

@torch.no_grad()
def build_bounded_prefill():
    return KDAModel(KDAConfig(gate_lower_bound=-5.0), dtype=torch.bfloat16).prefill(PROMPT)
