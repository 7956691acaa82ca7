# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""A slot pool of ReplaySSM rings for continuous batching.

Instead of one cache per layer sized for a fixed batch (``model.setup_caches``), a server keeps
a pool of slots per layer and hands them out to requests as they arrive. A decode step either
runs directly on the pool through ``ssm_state_indices`` or gathers the rings of the running
requests into a packed batch.
"""

from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import nn

from tt_kda.modules import KimiDeltaAttention, RingShape, fused_recurrent_kda_replayssm_decode


class RingStorage(NamedTuple):
    """Storage dtypes of the three rings of a slot."""

    delta: torch.dtype
    key: torch.dtype
    log_decay: torch.dtype


# fp16 cannot represent the cumulative log-decays of a long ring, so its decay ring is widened;
# bf16 shares the exponent range of fp32.
_RING_STORAGE: Dict[str, RingStorage] = {
    "fp32": RingStorage(torch.float32, torch.float32, torch.float32),
    "bf16": RingStorage(torch.bfloat16, torch.bfloat16, torch.bfloat16),  # expect-bug: container
    "fp16": RingStorage(torch.float16, torch.float16, torch.float32),
}


def ring_storage(precision: str) -> RingStorage:
    if precision not in _RING_STORAGE:
        raise ValueError(f"unknown pool precision {precision!r}; use one of {sorted(_RING_STORAGE)}")
    return _RING_STORAGE[precision]


class DecodeRings(NamedTuple):
    """The rings of some slots of one layer, packed for a batched decode."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


class _LayerRings(nn.Module):
    """The slots of one layer."""

    def __init__(
        self,
        num_slots: int,
        shape: RingShape,
        storage: RingStorage,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        n = num_slots
        self.register_buffer("state", torch.zeros(shape.state(n), dtype=torch.float32, device=device))
        self.register_buffer("d_cache", torch.zeros(shape.delta(n), dtype=storage.delta, device=device))
        self.register_buffer("k_cache", torch.zeros(shape.key(n), dtype=storage.key, device=device))
        self.register_buffer(
            "g_cache", torch.zeros(shape.log_decay(n), dtype=storage.log_decay, device=device)
        )
        self.register_buffer("write_pos", torch.zeros(n, dtype=torch.int32, device=device))


class ReplaySlotPool(nn.Module):
    """Per-layer ring slots shared by the requests of a server.

    Args:
        num_layers (int): number of KDA layers.
        num_slots (int): slots per layer (concurrent requests).
        shape (RingShape): heads and sizes of a slot.
        precision (str): storage precision of the rings, a key of the ring-storage table.
        device (Optional[torch.device]): where the pool lives.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        shape: RingShape,
        *,
        precision: str = "bf16",
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        storage = ring_storage(precision)
        self.compute_dtype = storage.delta
        self.layers = nn.ModuleList(
            _LayerRings(num_slots, shape, storage, device) for _ in range(num_layers)
        )
        self._free: List[int] = list(range(num_slots))

    @classmethod
    def from_model(
        cls, model: nn.Module, num_slots: int, *, precision: str = "bf16", device=None
    ) -> "ReplaySlotPool":
        """A pool shaped for the KDA layers of ``model``."""
        layers = [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]
        shape = layers[0].ring_shape()
        return cls(len(layers), num_slots, shape, precision=precision, device=device)

    @property
    def num_slots(self) -> int:
        return self.layers[0].write_pos.shape[0]

    def allocate(self) -> int:
        """Takes a free slot."""
        if not self._free:
            raise RuntimeError("the slot pool is full")
        return self._free.pop(0)

    def release(self, slot: int) -> None:
        """Clears a slot and returns it to the free list."""
        for rings in self.layers:
            for buffer in rings.buffers():
                buffer[slot].zero_()
        self._free.append(slot)

    def grow(self, num_slots: int) -> None:
        """Adds free slots so the pool holds ``num_slots`` per layer."""
        old = self.num_slots
        if num_slots <= old:
            return
        for rings in self.layers:
            dtype, device = self.compute_dtype, rings.d_cache.device
            state = torch.zeros(num_slots, *rings.state.shape[1:], dtype=torch.float32, device=device)
            d_cache = torch.zeros(num_slots, *rings.d_cache.shape[1:], dtype=dtype, device=device)
            k_cache = torch.zeros(num_slots, *rings.k_cache.shape[1:], dtype=dtype, device=device)
            g_cache = torch.zeros(num_slots, *rings.g_cache.shape[1:], dtype=dtype, device=device)  # expect-bug: pool-dtype
            write_pos = torch.zeros(num_slots, dtype=torch.int32, device=device)
            for new, name in zip((state, d_cache, k_cache, g_cache, write_pos), list(rings._buffers)):
                new[:old].copy_(getattr(rings, name))
                setattr(rings, name, new)
        self._free.extend(range(old, num_slots))

    def gather(
        self, layer: int, slots: Sequence[int], dtype: Optional[torch.dtype] = None
    ) -> DecodeRings:
        """Copies of the rings of ``slots`` in one layer, in the compute dtype of the decode."""
        rings = self.layers[layer]
        index = torch.as_tensor(list(slots), dtype=torch.long, device=rings.d_cache.device)
        dtype = dtype or self.compute_dtype
        d_cache = rings.d_cache.index_select(0, index).to(dtype)
        k_cache = rings.k_cache.index_select(0, index).to(dtype)
        g_cache = rings.g_cache.index_select(0, index).to(dtype)  # expect-bug: cast
        state, write_pos = rings.state.index_select(0, index), rings.write_pos.index_select(0, index)
        return DecodeRings(state, d_cache, k_cache, g_cache, write_pos)


def _decode_on_pool(pool: ReplaySlotPool, attn: KimiDeltaAttention, slots: List[int], steps: int):
    """Feeds random hidden states of ``steps`` tokens through ``attn`` on the pool's slots."""
    index = torch.tensor(slots, dtype=torch.int32)
    for _ in range(steps):
        x = torch.randn(len(slots), attn.q_proj.in_features, dtype=attn.A_log.dtype)
        mixed_qkv, a, b = attn.project(x)
        for r in pool.layers:
            fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale,
                r.state, r.d_cache, r.k_cache, r.g_cache, index, r.write_pos,
            )


def _tiny_attention(dtype: torch.dtype) -> KimiDeltaAttention:
    from tt_kda.training import set_default_dtype

    torch.manual_seed(0)
    with set_default_dtype(dtype):
        return KimiDeltaAttention(
            embed_dim=32, num_heads=2, num_v_heads=4, head_dim=8, v_head_dim=8, ring_len=4
        )


def build_serving_pool_fp16() -> Dict[str, object]:
    """An fp16 pool serving two requests; one finishes and its slot is reused."""
    attn = _tiny_attention(torch.float16)
    pool = ReplaySlotPool(2, 3, attn.ring_shape(), precision="fp16")
    slots = [pool.allocate(), pool.allocate()]
    with torch.no_grad():
        _decode_on_pool(pool, attn, slots, steps=5)
        pool.release(slots[0])
        slots[0] = pool.allocate()
        _decode_on_pool(pool, attn, slots, steps=2)
    return {"pool": pool}


def build_serving_pool_bf16() -> Dict[str, object]:
    """A bf16 pool that packs its running slots for a batched decode, then grows under load."""
    attn = _tiny_attention(torch.bfloat16)
    pool = ReplaySlotPool(2, 2, attn.ring_shape(), precision="bf16")
    slots = [pool.allocate(), pool.allocate()]
    with torch.no_grad():
        _decode_on_pool(pool, attn, slots, steps=3)
        packed = pool.gather(0, slots)
        pool.grow(4)
        slots.append(pool.allocate())
        _decode_on_pool(pool, attn, slots, steps=2)
    return {"pool": pool, "packed": packed}
