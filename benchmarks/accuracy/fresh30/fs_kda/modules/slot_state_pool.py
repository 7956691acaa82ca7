"""The slot pool of streaming KDA decoders (``--max-slots``).

Instead of one incremental buffer per sequence, a streaming decoder owns ``max_slots`` cache
slots per layer, registered as (non-persistent) buffers so that ``.to(device)`` moves them with
the model. Requests are given a slot by ``SlotStatePool.alloc`` and stepped together with
``KDADecoder.forward_slots``. Preempted requests are swapped out to host memory as raw bytes
(``swap_out``/``swap_in``); a full pool can be grown in place.
"""

import dataclasses
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from fs_kda import utils
from fs_kda.dataclass.configs import IncrementalStateConfig, SlotPoolConfig
from fs_kda.modules import kda_ops
from fs_kda.modules.kimi_delta_attention import KernelRings, KimiDeltaAttention, LayerShape


class LayerSlotCache(nn.Module):
    """One layer's slots: checkpoints, delta/key/log-decay rings and a cursor per slot."""

    def __init__(self, max_slots: int, shape: LayerShape, ring_len: int, ring_dtype: torch.dtype):
        super().__init__()
        h, hv, k_dim, v_dim = shape
        self.ring_len = ring_len
        self.register_buffer("state_buf", torch.zeros(max_slots, hv, v_dim, k_dim, dtype=torch.float32), persistent=False)
        self.register_buffer("delta_buf", torch.zeros(max_slots, hv, ring_len, v_dim, dtype=ring_dtype), persistent=False)
        self.register_buffer("key_buf", torch.zeros(max_slots, h, ring_len, k_dim, dtype=ring_dtype), persistent=False)
        self.register_buffer("log_decay_buf", torch.zeros(max_slots, hv, ring_len, k_dim), persistent=False)  # expect-bug: default-dtype id=low-mem-init
        self.register_buffer("cursor", torch.zeros(max_slots, dtype=torch.int32), persistent=False)

    def kernel_rings(self, slots: Tensor) -> KernelRings:
        return KernelRings(
            initial_state=self.state_buf,
            d_cache=self.delta_buf,
            k_cache=self.key_buf,
            g_cache=self.log_decay_buf,
            write_pos=self.cursor[slots.clamp(min=0).long()],
        )

    def advance(self, slots: Tensor, positions: Tensor, force_flush: Optional[Tensor] = None) -> None:
        kda_ops.advance_write_pos(self.cursor, slots, positions, self.ring_len, force_flush)

    def reset_slot(self, slot: int) -> None:
        for buf in (self.state_buf, self.delta_buf, self.key_buf, self.log_decay_buf, self.cursor):
            buf[slot].zero_()


class SwapEntry(NamedTuple):
    """A swapped-out slot: the raw bytes of each ``"<layer>.<buffer>"`` and how to read them."""

    data: Dict[str, bytes]
    dtypes: Dict[str, str]
    shapes: Dict[str, Tuple[int, ...]]


class SlotStatePool(nn.Module):
    def __init__(self, cfg: SlotPoolConfig, layer_shapes: List[LayerShape]):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(
            LayerSlotCache(cfg.max_slots, shape, cfg.ring_len, cfg.ring_dtype) for shape in layer_shapes
        )
        self.free_slots: List[int] = list(range(cfg.max_slots))
        self.slot_cache: Dict[str, int] = {}  # request id -> slot

    @property
    def num_slots(self) -> int:
        return self.cfg.max_slots

    def alloc(self, request_id: str) -> int:
        if request_id in self.slot_cache:
            return self.slot_cache[request_id]
        if not self.free_slots:
            raise RuntimeError(f"no free slot for {request_id!r} (max_slots={self.cfg.max_slots})")
        slot = self.free_slots.pop(0)
        for cache in self.layers:
            cache.reset_slot(slot)
        self.slot_cache[request_id] = slot
        return slot

    def release(self, request_id: str) -> int:
        slot = self.slot_cache.pop(request_id)
        self.free_slots.append(slot)
        self.free_slots.sort()
        return slot

    def grow(self, extra: int) -> None:
        """Adds ``extra`` slots, keeping the contents of the existing ones."""
        old = self.cfg.max_slots
        new_slots = old + extra
        for cache in self.layers:
            for name in ("delta_buf", "key_buf", "log_decay_buf"):
                buf = getattr(cache, name)
                grown = torch.zeros((new_slots, *buf.shape[1:]), dtype=self.cfg.ring_dtype, device=buf.device)  # expect-bug: pool-dtype
                grown[:old] = buf
                setattr(cache, name, grown)
            cache.state_buf = torch.cat([cache.state_buf, cache.state_buf.new_zeros((extra, *cache.state_buf.shape[1:]))])
            cache.cursor = torch.cat([cache.cursor, cache.cursor.new_zeros(extra)])
        self.free_slots.extend(range(old, new_slots))
        self.cfg = dataclasses.replace(self.cfg, max_slots=new_slots)

    def snapshot(self, slot: int) -> Dict[str, Tensor]:
        """Copies of one slot's buffers, ``{"<layer>.<buffer>": tensor}``."""
        return {
            f"{i}.{name}": buf[slot].clone()
            for i, cache in enumerate(self.layers)
            for name, buf in cache.named_buffers()
        }

    def swap_out(self, slot: int) -> SwapEntry:
        data, dtypes, shapes = {}, {}, {}
        for i, cache in enumerate(self.layers):
            for name, buf in cache.named_buffers():
                row = buf[slot].contiguous()
                key = f"{i}.{name}"
                data[key] = row.reshape(-1).view(torch.uint8).numpy().tobytes()
                dtypes[key] = str(row.dtype)
                shapes[key] = tuple(row.shape)
        return SwapEntry(data, dtypes, shapes)

    def swap_in(self, slot: int, entry: SwapEntry) -> None:
        for i, cache in enumerate(self.layers):
            for name, buf in cache.named_buffers():
                key = f"{i}.{name}"
                raw = torch.frombuffer(bytearray(entry.data[key]), dtype=utils.str_to_dtype(entry.dtypes[key]))
                buf[slot].copy_(raw.view(entry.shapes[key]))


def _layer_and_pool(dtype: torch.dtype, max_slots: int) -> Tuple[KimiDeltaAttention, SlotStatePool]:
    torch.manual_seed(0)
    layer = KimiDeltaAttention(
        32, 2, 4, 8, 8, ring_len=4, state_config=IncrementalStateConfig.for_model_dtype(dtype)
    ).to(dtype)
    pool = SlotStatePool(SlotPoolConfig(max_slots=max_slots, ring_len=4, ring_dtype=dtype), [layer.layer_shape])
    return layer, pool


def _steps(layer: KimiDeltaAttention, pool: SlotStatePool, slots: Tensor, n: int, dtype: torch.dtype) -> None:
    for _ in range(n):
        layer.step_slots(torch.randn(slots.shape[0], 32).to(dtype), pool.layers[0], slots)


def build_pool_decode_bf16() -> Dict[str, object]:
    """A bf16 layer on a 3-slot pool: two requests (and a padding row), a swap-out/swap-in of
    one of them, a released slot handed to a third request."""
    layer, pool = _layer_and_pool(torch.bfloat16, 3)
    a, b = pool.alloc("a"), pool.alloc("b")
    slots = torch.tensor([a, -1, b], dtype=torch.int32)
    _steps(layer, pool, slots, 3, torch.bfloat16)
    entry = pool.swap_out(b)
    pool.release("b")
    c = pool.alloc("c")
    _steps(layer, pool, torch.tensor([a, c], dtype=torch.int32), 2, torch.bfloat16)
    pool.release("c")
    pool.swap_in(pool.alloc("b"), entry)
    _steps(layer, pool, torch.tensor([a, b], dtype=torch.int32), 2, torch.bfloat16)
    return {"pool": pool, "snapshot": pool.snapshot(a), "decode": dict(kda_ops.last_decode_call())}


def build_pool_grow() -> Dict[str, object]:
    """A full bf16 pool of two slots grown to four, then stepped on all of them."""
    layer, pool = _layer_and_pool(torch.bfloat16, 2)
    first = torch.tensor([pool.alloc("a"), pool.alloc("b")], dtype=torch.int32)
    _steps(layer, pool, first, 2, torch.bfloat16)
    pool.grow(2)
    every = torch.tensor([pool.alloc(r) for r in ("a", "b", "c", "d")], dtype=torch.int32)
    _steps(layer, pool, every, 3, torch.bfloat16)
    return {"pool": pool}
