"""Slot pool of ReplaySSM rings (checkpoint states, d/k/log-decay rings, cursors) and page tables."""

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from .utils import ReplayRingConfig, canonicalize_torch_dtype, get_index_data_type, get_state_data_type


class RingShape(NamedTuple):
    num_slots: int
    num_qk_heads: int
    num_v_heads: int
    head_dim_k: int
    head_dim_v: int
    ring_len: int

    def state(self) -> Tuple[int, ...]:
        return (self.num_slots, self.num_v_heads, self.head_dim_v, self.head_dim_k)

    def delta(self) -> Tuple[int, ...]:
        return (self.num_slots, self.num_v_heads, self.ring_len, self.head_dim_v)

    def key(self) -> Tuple[int, ...]:
        return (self.num_slots, self.num_qk_heads, self.ring_len, self.head_dim_k)

    def log_decay(self) -> Tuple[int, ...]:
        return (self.num_slots, self.num_v_heads, self.ring_len, self.head_dim_k)

    @classmethod
    def from_config(cls, config: ReplayRingConfig, num_slots: int) -> "RingShape":
        return cls(
            num_slots, config.num_qk_heads, config.num_v_heads, config.head_dim_k, config.head_dim_v, config.ring_len
        )


class RingDataTypes(NamedTuple):
    """Storage dtypes of one pool; the defaults describe a bf16 deployment."""

    state: torch.dtype = torch.bfloat16
    delta: torch.dtype = torch.bfloat16
    key: torch.dtype = torch.bfloat16
    log_decay: torch.dtype = torch.bfloat16  # expect-bug: container

    @classmethod
    def for_kv(cls, kv_data_type: Union[str, torch.dtype]) -> "RingDataTypes":
        kv = canonicalize_torch_dtype(kv_data_type)
        return cls(get_state_data_type(kv), kv, kv, torch.float32)


def _allocate_ring_group(
    shapes: Sequence[Tuple[int, ...]], dtype: torch.dtype, device: Union[str, torch.device]
) -> List[torch.Tensor]:
    return [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]


def advance_write_pos(
    write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Cursors after one decode step: 0 after a flush (last row, or forced), else ``c + 1``."""
    flush = write_pos == ring_len - 1
    if force_flush is not None:
        flush = flush | (force_flush != 0)
    return torch.where(flush, torch.zeros_like(write_pos), write_pos + 1).to(get_index_data_type())


def get_slot_page_table(slots: torch.Tensor, write_pos: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """``(indptr, indices, last_page_len)`` for one ring slot per request (int32 each)."""
    idx = get_index_data_type()
    indptr = torch.arange(slots.numel() + 1, dtype=idx, device=slots.device)
    return indptr, slots.to(idx), write_pos.to(idx)


class ReplayRingPool:
    """Fixed number of slots; each holds a checkpoint state, three rings and a cursor.

    Parameters
    ----------
    shape : RingShape
        Slots, heads, head dims and ring length.
    dtypes : RingDataTypes
        Storage dtypes; ``RingDataTypes.for_kv(kv_data_type)`` for a given kv data type.
    """

    def __init__(self, shape: RingShape, dtypes: RingDataTypes = RingDataTypes(), device: Union[str, torch.device] = "cpu"):
        self.shape = shape
        self.dtypes = dtypes
        self.device = torch.device(device)
        self.ssm_state = torch.zeros(shape.state(), dtype=dtypes.state, device=device)
        self.delta_buf = torch.zeros(shape.delta(), dtype=dtypes.delta, device=device)
        self.key_buf = torch.zeros(shape.key(), dtype=dtypes.key, device=device)
        self.log_decay_buf = torch.zeros(shape.log_decay(), dtype=dtypes.log_decay, device=device)
        self.write_pos = torch.zeros(shape.num_slots, dtype=get_index_data_type(), device=device)
        self._free: List[int] = list(range(shape.num_slots))

    @classmethod
    def from_config(cls, config: ReplayRingConfig, num_slots: int, device="cpu") -> "ReplayRingPool":
        dtypes = RingDataTypes(
            state=config.state_data_type,
            delta=config.ring_data_type,
            key=config.ring_data_type,
            log_decay=config.log_decay_data_type,  # expect-bug: imported-policy id=ring-config
        )
        return cls(RingShape.from_config(config, num_slots), dtypes, device)

    @classmethod
    def from_prefill(
        cls,
        ssm_state: torch.Tensor,
        delta_rows: torch.Tensor,
        key_rows: torch.Tensor,
        g_cumsum: torch.Tensor,
        ring_len: int,
    ) -> "ReplayRingPool":
        """A pool whose slots hold the T rows a chunked prefill left (cursors at T).

        ``g_cumsum`` is the prefill kernel's chunk-local cumulative log-decay ``[S, HV, T, K]``,
        in the activation dtype; the ring stores per-step values.
        """
        S, HV, V, K = ssm_state.shape
        T = delta_rows.shape[2]
        shape = RingShape(S, key_rows.shape[1], HV, K, V, ring_len)
        pool = cls(shape, RingDataTypes.for_kv(delta_rows.dtype), ssm_state.device)
        pool.ssm_state.copy_(ssm_state)
        pool.delta_buf[:, :, :T] = delta_rows
        pool.key_buf[:, :, :T] = key_rows
        pool.log_decay_buf = F.pad(torch.cat([g_cumsum[:, :, :1], g_cumsum.diff(dim=2)], dim=2), (0, 0, 0, ring_len - T))  # expect-bug: promotion
        pool.write_pos.fill_(T)
        return pool

    def ring_cache(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tuple form the decode wrappers take as ``paged_ring_cache``."""
        return self.ssm_state, self.delta_buf, self.key_buf, self.log_decay_buf

    def alloc(self, n: int) -> torch.Tensor:
        if n > len(self._free):
            raise RuntimeError(f"ReplayRingPool: {n} slots requested, {len(self._free)} free")
        taken, self._free = self._free[:n], self._free[n:]
        slots = torch.tensor(taken, dtype=get_index_data_type(), device=self.device)
        self.reset(slots)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        self._free.extend(int(s) for s in slots.tolist())

    def reset(self, slots: torch.Tensor) -> None:
        """Zeroes the state, rings and cursor of ``slots`` in place."""
        idx = slots.long()
        for buf in (self.ssm_state, self.delta_buf, self.key_buf, self.log_decay_buf):
            buf[idx] = 0
        self.write_pos[idx] = 0

    def advance(self, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> None:
        idx = slots.long()
        self.write_pos[idx] = advance_write_pos(self.write_pos[idx], self.shape.ring_len, force_flush)

    def page_table(self, slots: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return get_slot_page_table(slots, self.write_pos[slots.long()])

    def seed(self, slots: torch.Tensor, delta_rows: torch.Tensor, key_rows: torch.Tensor, log_decay_rows: torch.Tensor) -> None:
        """Writes T rows into the rings of ``slots`` (in place, in the rings' dtypes); cursors at T."""
        idx = slots.long()
        T = delta_rows.shape[2]
        self.delta_buf[idx, :, :T] = delta_rows.to(self.delta_buf.dtype)
        self.key_buf[idx, :, :T] = key_rows.to(self.key_buf.dtype)
        self.log_decay_buf[idx, :, :T] = log_decay_rows.to(self.log_decay_buf.dtype)
        self.write_pos[idx] = T

    def grow(self, ring_len: int) -> None:
        """Lengthens every ring to ``ring_len`` rows; existing rows and cursors are kept."""
        S, H, HV, K, V, L = (
            self.shape.num_slots, self.shape.num_qk_heads, self.shape.num_v_heads,
            self.shape.head_dim_k, self.shape.head_dim_v, self.shape.ring_len,
        )
        pad = ring_len - L
        self.delta_buf = torch.cat([self.delta_buf, self.delta_buf.new_zeros(S, HV, pad, V)], dim=2)
        self.key_buf = torch.cat([self.key_buf, self.key_buf.new_zeros(S, H, pad, K)], dim=2)
        # zero rows of the d ring's dtype are promoted to the log-decay ring's float32 by cat
        self.log_decay_buf = torch.cat([self.log_decay_buf, self.delta_buf.new_zeros(S, HV, pad, K)], dim=2)
        self.shape = self.shape._replace(ring_len=ring_len)

    def spawn(self, num_slots: int) -> "ReplayRingPool":
        """An empty pool with this pool's layout and dtypes and ``num_slots`` slots."""
        child = ReplayRingPool.__new__(ReplayRingPool)
        child.shape = self.shape._replace(num_slots=num_slots)
        child.dtypes = self.dtypes
        child.device = self.device
        child.ssm_state = torch.zeros_like(self.ssm_state[:num_slots])
        child.delta_buf = torch.zeros_like(self.delta_buf[:num_slots])
        child.key_buf = torch.zeros_like(self.key_buf[:num_slots])
        child.log_decay_buf = torch.zeros_like(self.key_buf[:num_slots])  # expect-bug: like
        child.write_pos = self.write_pos.new_zeros(num_slots)
        child._free = list(range(num_slots))
        return child

    def compact(self, slots: torch.Tensor) -> "ReplayRingPool":
        """A new pool holding copies of ``slots`` (in that order)."""
        idx = slots.long()
        child = self.spawn(len(idx))
        child.ssm_state.copy_(self.ssm_state[idx])
        child.delta_buf.copy_(self.delta_buf[idx])
        child.key_buf.copy_(self.key_buf[idx])
        child.write_pos.copy_(self.write_pos[idx])
        child.log_decay_buf = self.log_decay_buf[idx].clone()
        return child

    def scratch(self) -> "ReplayRingPool":
        """An empty pool shaped like this one for staging a batch; its rings are fresh tensors."""
        child = ReplayRingPool.__new__(ReplayRingPool)
        child.shape, child.dtypes, child.device = self.shape, self.dtypes, self.device
        child.ssm_state = torch.zeros_like(self.ssm_state)
        child.delta_buf = torch.empty_like(self.delta_buf).zero_()
        child.key_buf = self.key_buf.new_zeros(self.shape.key())
        child.log_decay_buf = self.log_decay_buf.new_zeros(self.shape.log_decay())
        child.write_pos = torch.zeros_like(self.write_pos)
        child._free = list(range(self.shape.num_slots))
        return child


class PackedRingPool(ReplayRingPool):
    """Pool whose three rings are allocated in one call, in the kv data type."""

    def __init__(self, shape: RingShape, kv_data_type: Union[str, torch.dtype] = "bfloat16", device="cpu"):
        kv = canonicalize_torch_dtype(kv_data_type)
        self.shape = shape
        self.dtypes = RingDataTypes.for_kv(kv)
        self.device = torch.device(device)
        self.ssm_state = torch.zeros(shape.state(), dtype=self.dtypes.state, device=device)
        self.delta_buf, self.key_buf, self.log_decay_buf = _allocate_ring_group((shape.delta(), shape.key(), shape.log_decay()), kv, device)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(shape.num_slots, dtype=get_index_data_type(), device=device)
        self._free = list(range(shape.num_slots))


SHAPE = RingShape(num_slots=4, num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4)


def _step(pool: ReplayRingPool, slots: torch.Tensor, dtype: torch.dtype, force_flush=None) -> torch.Tensor:
    from .decode import BatchKDADecodeWithReplayRingWrapper, random_decode_inputs

    s = pool.shape
    wrapper = BatchKDADecodeWithReplayRingWrapper(torch.zeros(1 << 14, dtype=torch.uint8))
    indptr, indices, last_page_len = pool.page_table(slots)
    wrapper.plan(
        indptr, indices, last_page_len, s.num_qk_heads, s.num_v_heads, s.head_dim_k, s.head_dim_v,
        s.ring_len, q_data_type=dtype, kv_data_type=pool.delta_buf.dtype,
    )
    mixed_qkv, a, b, A_log, dt_bias = random_decode_inputs(len(slots), s.num_qk_heads, s.num_v_heads, s.head_dim_k, s.head_dim_v, dtype)
    out = wrapper.run(mixed_qkv, a, b, pool.ring_cache(), A_log, dt_bias, force_flush=force_flush)
    pool.advance(slots, force_flush)
    return out


def build_ring_pool():
    """A bf16 pool: two requests, prefill rows seeded in place, three decode steps, then grown to 6 rows."""
    torch.manual_seed(1)
    pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv("bf16"))
    slots = pool.alloc(2)
    g_cumsum = (-torch.rand(2, SHAPE.num_v_heads, 2, SHAPE.head_dim_k)).cumsum(2).to(torch.bfloat16)
    step_log_decay = torch.cat([g_cumsum[:, :, :1], g_cumsum.diff(dim=2)], dim=2)
    pool.seed(
        slots,
        torch.randn(2, SHAPE.num_v_heads, 2, SHAPE.head_dim_v).to(torch.bfloat16),
        torch.randn(2, SHAPE.num_qk_heads, 2, SHAPE.head_dim_k).to(torch.bfloat16),
        step_log_decay,
    )
    outs = [_step(pool, slots, torch.bfloat16) for _ in range(3)]
    pool.grow(6)
    outs.append(_step(pool, slots, torch.bfloat16))
    staging = pool.scratch()
    kept = pool.compact(slots[:1])
    return {"pool": pool, "staging": staging, "kept": kept, "outs": outs}


def build_packed_pool():
    """A packed bf16 pool and a pool with the default dtypes, two decode steps each."""
    torch.manual_seed(2)
    packed = PackedRingPool(SHAPE, "bfloat16")
    default = ReplayRingPool(SHAPE)
    outs = []
    for pool in (packed, default):
        slots = pool.alloc(3)
        outs += [_step(pool, slots, torch.bfloat16), _step(pool, slots, torch.bfloat16)]
    return {"packed": packed, "default": default, "outs": outs}


def build_prefill_pool():
    """A pool built from a ring config and one built from a bf16 prefill; each decodes twice."""
    torch.manual_seed(3)
    config = ReplayRingConfig(num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4, kv_data_type="bf16")
    configured = ReplayRingPool.from_config(config, num_slots=3)
    slots = configured.alloc(2)
    T = 2
    g_cumsum = (-torch.rand(3, 2, T, 8)).cumsum(2).to(torch.bfloat16)
    prefilled = ReplayRingPool.from_prefill(
        torch.randn(3, 2, 8, 8).to(torch.bfloat16),
        torch.randn(3, 2, T, 8).to(torch.bfloat16),
        torch.randn(3, 2, T, 8).to(torch.bfloat16),
        g_cumsum,
        ring_len=4,
    )
    all_slots = torch.arange(3, dtype=torch.int32)
    outs = [
        _step(configured, slots, torch.bfloat16),
        _step(prefilled, all_slots, torch.bfloat16),
        _step(configured, slots, torch.bfloat16, force_flush=torch.tensor([1, 0], dtype=torch.int32)),
        _step(prefilled, all_slots, torch.bfloat16),
    ]
    return {"configured": configured, "prefilled": prefilled, "outs": outs}
