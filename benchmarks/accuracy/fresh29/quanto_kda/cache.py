"""QuantizedKDACache: ReplaySSM rings with the d and k rings quantized (like QuantoQuantizedCache).

With an integer cache qtype the d and k rings are codes with a float32 scale per slot (and a zero
point for unsigned qtypes), dequantized to ``residual_dtype`` for the kernel; with a float qtype
or ``quantize_rings=False`` they are plain tensors. The gate ring is never quantized.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from . import utils
from .kernels import ReplayDecodeRunner, fused_recurrent_kda_replayssm_decode, last_inputs
from .model import KDAConfig, ring_shapes
from .tensor import CACHE_RING_QTYPES, QTensor, quantize


@dataclasses.dataclass
class QuantizedCacheConfig:
    qtype: str = "qint8"
    residual_dtype: torch.dtype = torch.bfloat16
    quantize_rings: bool = True


def _regrow(old: torch.Tensor, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    new = torch.zeros((num_slots, *old.shape[1:]), dtype=dtype)
    keep = min(num_slots, old.shape[0])
    new[:keep] = old[:keep]
    return new


class QuantizedKDACache:
    def __init__(self, shapes: dict[str, tuple[int, ...]], config: QuantizedCacheConfig | None = None):
        self.config = cfg = config or QuantizedCacheConfig()
        ring_qtypes = CACHE_RING_QTYPES[cfg.qtype]
        self.state = torch.zeros(shapes["state"], dtype=torch.float32)
        self.slot_steps = torch.zeros(shapes["state"][0], dtype=torch.int32)
        self.rings: dict[str, torch.Tensor | QTensor] = {}
        for ring in ("d", "k"):
            q = ring_qtypes[ring]
            if q.is_floating_point or not cfg.quantize_rings:
                self.rings[ring] = torch.zeros(shapes[ring], dtype=q.dtype if q.is_floating_point else cfg.residual_dtype)
            else:
                scale = torch.ones(shapes[ring][0], 1, 1, 1, dtype=torch.float32)
                zero_point = torch.zeros_like(scale, dtype=torch.int32) if q.qmin == 0 else None
                self.rings[ring] = QTensor(q, torch.zeros(shapes[ring], dtype=q.dtype), scale, zero_point)
        self.gate_residual = torch.zeros(shapes["g"], dtype=ring_qtypes["gate"].dtype)  # expect-bug: imported-policy id=ring-qtypes

    @classmethod
    def from_float(cls, rings: dict[str, torch.Tensor], config: QuantizedCacheConfig) -> QuantizedKDACache:
        """A cache holding the rings of a prefill (``KDAAttention.prefill``)."""
        shapes = {"state": rings["state"].shape, "d": rings["d_ring"].shape, "k": rings["k_ring"].shape, "g": rings["log_decay_q"].shape}
        cache = cls(shapes, config)
        cache.state.copy_(rings["state"])
        for ring in ("d", "k"):
            cache.write(ring, torch.arange(shapes["state"][0]), rings[f"{ring}_ring"])
        cache.gate_residual = rings["log_decay_q"].to(utils.residual_dtype("gate", config.residual_dtype))  # expect-bug: imported-policy id=residual-policy
        return cache

    def ring(self, ring: str) -> torch.Tensor:
        """The d or k ring as the kernel reads it."""
        stored = self.rings[ring]
        return stored.dequantize(self.config.residual_dtype) if isinstance(stored, QTensor) else stored

    def write(self, ring: str, slot_ids: torch.Tensor, window: torch.Tensor) -> None:
        stored = self.rings[ring]
        if isinstance(stored, QTensor):
            stored.assign(slot_ids, quantize(window, stored.qtype, dims=(1, 2, 3)))
        else:
            stored[slot_ids] = window.to(stored.dtype)

    def update(self, slot_ids: torch.Tensor, d_row: torch.Tensor, k_row: torch.Tensor, g_row: torch.Tensor) -> None:
        for ring, row in (("d", d_row), ("k", k_row)):
            window = self.ring(ring)[slot_ids, :, 1:]
            self.write(ring, slot_ids, torch.cat([window.float(), row.float()[:, :, None]], dim=2))
        # a bf16 row promotes to the float32 ring's dtype
        self.gate_residual[slot_ids] = torch.cat([self.gate_residual[slot_ids, :, 1:], g_row[:, :, None]], dim=2)
        self.slot_steps[slot_ids] += 1

    def decode(self, q, k, v, g, beta, slot_ids: torch.Tensor) -> torch.Tensor:
        o = fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, initial_state=self.state, initial_state_indices=slot_ids, d_cache=self.ring("d"), k_cache=self.ring("k"), g_cache=self.gate_residual, cache_steps=self.slot_steps)
        self.update(slot_ids, beta[..., None] * v, k, g)
        return o

    def graph_inputs(self, slot_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Static inputs for ``ReplayDecodeRunner``: the rings dequantized once, contiguous."""
        rings = {"d_cache": self.ring("d"), "k_cache": self.ring("k"), "g_cache": self.gate_residual}
        static = {name: ring.to(self.config.residual_dtype).contiguous() for name, ring in rings.items()}  # expect-bug: decode-arg
        static.update(initial_state=self.state, initial_state_indices=slot_ids, cache_steps=self.slot_steps)
        return static

    def resize(self, num_slots: int) -> None:
        """Grow or shrink an unquantized cache to ``num_slots`` rows, keeping the rows that remain."""
        if any(isinstance(stored, QTensor) for stored in self.rings.values()):
            raise NotImplementedError("re-quantize a quantized cache instead")
        self.state, self.slot_steps = _regrow(self.state, num_slots, torch.float32), _regrow(self.slot_steps, num_slots, torch.int32)
        grown = {name: _regrow(t, num_slots, self.config.residual_dtype) for name, t in (*self.rings.items(), ("gate", self.gate_residual))}  # expect-bug: pool-dtype
        self.gate_residual = grown.pop("gate")
        self.rings.update(grown)

    def clone_empty(self) -> QuantizedKDACache:
        """A cache with this one's layout and no history (for a second scheduler stream)."""
        new = copy.copy(self)
        new.state, new.slot_steps = torch.zeros_like(self.state), torch.zeros_like(self.slot_steps)
        new.rings = {name: stored.zeros_like() if isinstance(stored, QTensor) else torch.zeros_like(stored) for name, stored in self.rings.items()}
        new.gate_residual = torch.zeros_like(self.ring("k"))  # expect-bug: like
        return new

    def astype(self, dtype: torch.dtype) -> QuantizedKDACache:
        """Follow a cast of the model: unquantized rings go to ``dtype``, codes stay as they are."""
        self.config = dataclasses.replace(self.config, residual_dtype=dtype)
        self.rings = {name: r if isinstance(r, QTensor) else r.to(dtype) for name, r in self.rings.items()}
        self.gate_residual = self.gate_residual.type(dtype)  # expect-bug: cast
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {"state": self.state, "slot_steps": self.slot_steps, "gate_residual": self.gate_residual}
        for name, stored in self.rings.items():
            if isinstance(stored, QTensor):
                out.update({f"rings.{name}.{field}": t for field, t in vars(stored).items() if isinstance(t, torch.Tensor)})
            else:
                out[f"rings.{name}"] = stored
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        current = self.state_dict()
        for name, tensor in state.items():
            current[name].copy_(tensor)

    def set_tensor(self, name: str, tensor: torch.Tensor) -> None:
        parts = name.split(".")
        if parts[0] != "rings":
            setattr(self, name, tensor)
        elif len(parts) == 2:
            self.rings[parts[1]] = tensor
        else:
            setattr(self.rings[parts[1]], parts[2], tensor)


def _cache(qtype: str = "qint8", residual_dtype=torch.bfloat16, quantize_rings: bool = True) -> QuantizedKDACache:
    return QuantizedKDACache(ring_shapes(KDAConfig(), 2), QuantizedCacheConfig(qtype, residual_dtype, quantize_rings))

def _steps(cache: QuantizedKDACache, n: int = 2, dtype=torch.bfloat16, runner=None) -> QuantizedKDACache:
    slots = torch.tensor([0, 1], dtype=torch.int32)
    for _ in range(n):
        q, k, v = (torch.randn(2, 2, 4, dtype=dtype) for _ in range(3))
        g, beta = -torch.rand(2, 2, 4, dtype=dtype), torch.rand(2, 2, dtype=dtype)
        if runner is None:
            cache.decode(q, k, v, g, beta, slots)
        else:
            runner(q, k, v, g, beta)
            cache.update(slots, beta[..., None] * v, k, g)
    return cache

def build_quantized_cache_uint8():
    return _steps(_cache("quint8"))

def build_residual_cache_fp16():
    cache = _steps(_cache("qfp16", residual_dtype=torch.float16), dtype=torch.float16)
    return {"cache": cache, "kernel": last_inputs()}

def build_bf16_qtype_cache():
    return _steps(_cache("qbf16"))

def build_graph_replay():
    cache = _steps(_cache("qint8"), n=1)
    runner = ReplayDecodeRunner(cache.graph_inputs(torch.tensor([0, 1], dtype=torch.int32)))
    return {"cache": _steps(cache, n=1, runner=runner), "runner": runner}

def build_resized_cache():
    cache = _steps(_cache("qint8", quantize_rings=False))
    cache.resize(4)
    return cache

def build_stream_caches():
    cache = _steps(_cache("qint8"))
    return [cache, cache.clone_empty()]

def build_cache_fp16():
    return _steps(_cache("qint8", quantize_rings=False)).astype(torch.float16)
