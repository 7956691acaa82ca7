"""The KDA attention module of the ragged engine, and in-model ring buffers for compact
(single-replica) deployments."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accelerator import accelerator_override, CPU_Accelerator, get_accelerator
from ..config_v2 import DeepSpeedConfigModel, DtypeEnum
from ..kernels import fused_recurrent_kda_replayssm_decode, kda_gate, recurrent_kda_rows
from ..ragged.ssm_cache import BlockedSSMCache, LayerRings, SlotAccessMixin, _demo_configs


class DSKDAConfig(DeepSpeedConfigModel):
    hidden_size: int
    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    ring_len: int
    dtype: DtypeEnum = DtypeEnum.bf16
    """Weights and activations."""

    @property
    def state_shape(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def delta_shape(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.ring_len, self.head_v_dim)

    @property
    def key_shape(self) -> Tuple[int, int, int]:
        return (self.num_heads, self.ring_len, self.head_k_dim)

    @property
    def decay_shape(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.ring_len, self.head_k_dim)


class DSModuleBase(nn.Module):
    """Base of the ragged inference modules."""

    def __init__(self, config: DeepSpeedConfigModel) -> None:
        super().__init__()
        self._config = config


class DSKDAAttention(DSModuleBase):
    """Kimi Delta Attention for ragged batches; decoding goes through the ReplaySSM kernel."""

    @staticmethod
    def supports_config(config: DSKDAConfig) -> bool:
        return config.num_v_heads % config.num_heads == 0

    def __init__(self, config: DSKDAConfig) -> None:
        super().__init__(config)
        c, dtype = config, config.dtype.value
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_k_dim, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_k_dim, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(c.hidden_size, c.num_v_heads * c.head_v_dim, bias=False, dtype=dtype)
        self.f_proj = nn.Linear(c.hidden_size, c.num_v_heads * c.head_k_dim, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(c.hidden_size, c.num_v_heads, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(c.num_v_heads * c.head_v_dim, c.hidden_size, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.zeros(c.num_v_heads, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.zeros(c.num_v_heads * c.head_k_dim, dtype=dtype))

    def _project(self, hidden: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        c, n = self._config, hidden.shape[0]
        q = self.q_proj(hidden).view(n, c.num_heads, c.head_k_dim)
        k = self.k_proj(hidden).view(n, c.num_heads, c.head_k_dim)
        v = self.v_proj(hidden).view(n, c.num_v_heads, c.head_v_dim)
        return q, k, v, self.f_proj(hidden), self.b_proj(hidden)

    def forward(
        self,
        hidden: Tensor,
        slot_ids: Tensor,
        rings: LayerRings,
        cache: Optional[SlotAccessMixin] = None,
        layer_idx: Optional[int] = None,
    ) -> Tensor:
        q, k, v, f, b = self._project(hidden)
        g = kda_gate(f, self.A_log, self.dt_bias, self._config.num_v_heads)
        beta = b.float().sigmoid()
        g_cache = rings.decay_ring
        if g_cache.dtype != rings.delta_ring.dtype and not get_accelerator().supports_mixed_dtype_rings():
            # This kernel build reads every ring with one element type; keep the converted ring
            # so that the conversion happens once, not at every step.
            g_cache = g_cache.to(rings.delta_ring.dtype)  # expect-bug: decode-arg
            if cache is not None:
                cache.update_layer(layer_idx, decay_ring=g_cache)
        out = fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta,
            initial_state=rings.state, d_cache=rings.delta_ring, k_cache=rings.key_ring, g_cache=g_cache,
            write_pos=rings.write_pos, slot_ids=slot_ids,
        )
        return self.o_proj(out.flatten(1).to(hidden.dtype))

    def prefill_rows(self, hidden: Tensor) -> Tuple[Dict[str, Tensor], Tensor]:
        """Runs a prompt of ``T < ring_len`` tokens from an empty slot and returns the slot
        contents it leaves (rows ``[:, :T]`` of each ring) and the module's output ``[T, hidden]``.

        Used by prefill-only replicas, which hand the rows to a decode replica (``load_slot``).
        """
        c = self._config
        steps = hidden.shape[0]
        q, k, v, f, b = self._project(hidden)
        f = f.view(steps, c.num_v_heads, c.head_k_dim)
        log_decay = -self.A_log.exp().unsqueeze(-1) * F.softplus(f + self.dt_bias.view(c.num_v_heads, c.head_k_dim))  # expect-bug: promotion id=prefill-gate
        deltas, keys, out = recurrent_kda_rows(q, k, v, log_decay, b.float().sigmoid())
        decay_rows = log_decay.transpose(0, 1).contiguous()  # expect-bug: promotion id=prefill-gate
        rows = {
            "state": torch.zeros(c.state_shape, dtype=torch.float32, device=hidden.device),
            "delta_ring": deltas.to(c.dtype.value),
            "key_ring": keys.to(c.dtype.value),
            "decay_ring": decay_rows,
            "write_pos": torch.tensor(steps, dtype=torch.int32),
        }
        return rows, self.o_proj(out.flatten(1).to(hidden.dtype))


class KDARingBuffers(nn.Module):
    """One layer's rings as module buffers, so that they move with the model (``model.to``)."""

    def __init__(self, config: DSKDAConfig, num_slots: int) -> None:
        super().__init__()
        dtype = config.dtype.value
        self.register_buffer("state", torch.zeros((num_slots, *config.state_shape), dtype=torch.float32), persistent=False)
        self.register_buffer("delta_ring", torch.zeros((num_slots, *config.delta_shape), dtype=dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros((num_slots, *config.key_shape), dtype=dtype), persistent=False)
        self.register_buffer("decay_ring", torch.zeros((num_slots, *config.decay_shape)), persistent=False)  # expect-bug: default-dtype id=factory-default
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    @property
    def num_slots(self) -> int:
        return self.write_pos.shape[0]

    def rings(self) -> LayerRings:
        return LayerRings(self.state, self.delta_ring, self.key_ring, self.decay_ring, self.write_pos)


class PinnedKDARingBuffers(KDARingBuffers):
    """``KDARingBuffers`` whose checkpoint and log-decay buffers keep float32 through casts of
    the owning model (``model.half()``, ``model.to(torch.bfloat16)``); moves still apply."""

    _PINNED = ("state", "decay_ring")

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        pinned = {name: self._buffers.pop(name) for name in self._PINNED}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, buffer in pinned.items():
                self._buffers[name] = buffer.to(device=self.delta_ring.device)
        return self


class ModuleRingCache(SlotAccessMixin):
    """The cache interface of ``BlockedSSMCache`` over a model's ``KDARingBuffers``.

    Reads the buffers at every call, so a cast or move of the model is seen at once.
    """

    def __init__(self, buffers: nn.ModuleList) -> None:
        self._buffers = buffers

    @property
    def num_layers(self) -> int:
        return len(self._buffers)

    @property
    def num_slots(self) -> int:
        return self._buffers[0].num_slots

    def layer(self, layer_idx: int) -> LayerRings:
        return self._buffers[layer_idx].rings()

    def update_layer(self, layer_idx: int, **tensors: Tensor) -> None:
        module = self._buffers[layer_idx]
        for name, tensor in tensors.items():
            setattr(module, name, tensor)


def _demo_module(dtype: torch.dtype) -> DSKDAAttention:
    config = DSKDAConfig(hidden_size=16, num_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, ring_len=4, dtype=dtype)
    module = DSKDAAttention(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name == "A_log":
                param.copy_(torch.linspace(-1.0, 0.5, config.num_v_heads))
            elif name == "dt_bias":
                param.copy_(torch.linspace(-0.5, 0.5, param.numel()))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module.requires_grad_(False)


def build_prefill_handoff() -> Dict[str, object]:
    """A three-token prompt on a bf16 prefill replica, handed to a decode replica's slot 1 and
    decoded there for four steps next to slot 0."""
    torch.manual_seed(0)
    module = _demo_module(torch.bfloat16)
    with torch.no_grad():
        rows, out = module.prefill_rows(torch.randn(3, 16, dtype=torch.bfloat16))
        cache = BlockedSSMCache(_demo_configs(torch.bfloat16, num_slots=2, num_layers=1))
        cache.load_slot(0, 1, rows)
        slot_ids = torch.tensor([1, 0], dtype=torch.int32)
        outs = [module(torch.randn(2, 16, dtype=torch.bfloat16), slot_ids, cache.layer(0)) for _ in range(4)]
    return {"rows": rows, "rings": cache.layer(0), "out": out, "decoded": torch.stack(outs)}


def build_single_dtype_ring_kernel() -> Dict[str, object]:
    """Five decode launches of a bf16 module on an accelerator whose kernel build takes rings of
    one element type."""
    torch.manual_seed(0)
    module = _demo_module(torch.bfloat16)
    cache = BlockedSSMCache(_demo_configs(torch.bfloat16, num_layers=1))
    slot_ids = torch.tensor([1, 0], dtype=torch.int32)
    with accelerator_override(CPU_Accelerator(mixed_dtype_rings=False)), torch.no_grad():
        outs = [module(torch.randn(2, 16, dtype=torch.bfloat16), slot_ids, cache.layer(0), cache=cache, layer_idx=0) for _ in range(5)]
    return {"rings": cache.layer(0), "out": torch.stack(outs)}
