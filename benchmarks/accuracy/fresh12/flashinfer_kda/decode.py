"""Batch decode wrappers for KDA layers with ReplaySSM ring caches."""

import functools
from typing import Dict, Optional, Tuple, Union

import torch

from .jit import get_kda_decode_module
from .page import ReplayRingPool, RingDataTypes, RingShape, advance_write_pos, get_slot_page_table
from .utils import (
    ReplayRingConfig,
    _check_shape_dtype_device,
    _unpack_paged_ring_cache,
    canonicalize_torch_dtype,
    determine_ring_data_types,
    get_index_data_type,
    get_state_data_type,
)

RING_NAMES = ("ssm_state", "delta_buf", "key_buf", "log_decay_buf")


def random_decode_inputs(
    batch_size: int, num_qk_heads: int, num_v_heads: int, head_dim_k: int, head_dim_v: int, dtype: torch.dtype
) -> Tuple[torch.Tensor, ...]:
    """``(mixed_qkv, a, b, A_log, dt_bias)`` for one decode step; A_log and dt_bias are float32."""
    width = 2 * num_qk_heads * head_dim_k + num_v_heads * head_dim_v
    mixed_qkv = torch.randn(batch_size, width).to(dtype)
    a = torch.randn(batch_size, num_v_heads, head_dim_k).to(dtype)
    b = torch.randn(batch_size, num_v_heads).to(dtype)
    A_log = torch.linspace(-1.0, 0.5, num_v_heads)
    dt_bias = 0.1 * torch.randn(num_v_heads, head_dim_k)
    return mixed_qkv, a, b, A_log, dt_bias


def allocate_paged_ring_cache(
    num_slots: int,
    num_qk_heads: int,
    num_v_heads: int,
    head_dim_k: int,
    head_dim_v: int,
    ring_len: int,
    q_data_type: Union[str, torch.dtype],
    kv_data_type: Optional[Union[str, torch.dtype]] = None,
    device: Union[str, torch.device] = "cpu",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A zeroed ``(state, delta, key, log_decay)`` tuple for ``run``."""
    state_dtype, delta_dtype, key_dtype, log_decay_dtype = determine_ring_data_types(q_data_type, kv_data_type)
    shape = RingShape(num_slots, num_qk_heads, num_v_heads, head_dim_k, head_dim_v, ring_len)
    return (
        torch.zeros(shape.state(), dtype=state_dtype, device=device),
        torch.zeros(shape.delta(), dtype=delta_dtype, device=device),
        torch.zeros(shape.key(), dtype=key_dtype, device=device),
        torch.zeros(shape.log_decay(), dtype=log_decay_dtype, device=device),  # expect-bug: imported-policy id=ring-policy
    )


def convert_paged_ring_cache(
    paged_ring_cache: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    kv_data_type: Union[str, torch.dtype],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cache re-stored for a wrapper planned with another ``kv_data_type`` (new tensors)."""
    state, delta, key, log_decay = paged_ring_cache
    kv = canonicalize_torch_dtype(kv_data_type)
    return state.to(get_state_data_type(kv)), delta.to(kv), key.to(kv), log_decay.to(kv)  # expect-bug: cast


class BatchKDADecodeWithReplayRingWrapper:
    r"""Wrapper for batched ReplaySSM decode of KDA layers (one token per request).

    Each request owns one ring slot; the page table gives it as a single page:
    ``indices[indptr[i]]`` is the slot of request ``i`` and ``last_page_len[i]`` its cursor
    (the number of valid ring rows).

    Example
    -------
    >>> workspace_buffer = torch.zeros(1 << 20, dtype=torch.uint8)
    >>> wrapper = BatchKDADecodeWithReplayRingWrapper(workspace_buffer)
    >>> wrapper.plan(indptr, indices, last_page_len, 2, 2, 8, 8, 16, q_data_type="bf16")
    >>> out = wrapper.run(mixed_qkv, a, b, pool.ring_cache(), A_log, dt_bias)
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        ring_layout: str = "VK",
        use_cuda_graph: bool = False,
        paged_ring_indptr_buffer: Optional[torch.Tensor] = None,
        paged_ring_indices_buffer: Optional[torch.Tensor] = None,
        paged_ring_last_page_len_buffer: Optional[torch.Tensor] = None,
    ) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._int_workspace_buffer = torch.zeros((8 * 1024,), dtype=torch.uint8, device=self.device)
        self._ring_layout = ring_layout
        self._use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            for name, buf in (
                ("paged_ring_indptr_buffer", paged_ring_indptr_buffer),
                ("paged_ring_indices_buffer", paged_ring_indices_buffer),
                ("paged_ring_last_page_len_buffer", paged_ring_last_page_len_buffer),
            ):
                if buf is None:
                    raise ValueError(f"{name} is required when use_cuda_graph is True")
                _check_shape_dtype_device(buf, None, get_index_data_type(), self.device, name)
            self._fixed_batch_size = len(paged_ring_last_page_len_buffer)
        self._paged_ring_indptr_buf = paged_ring_indptr_buffer
        self._paged_ring_indices_buf = paged_ring_indices_buffer
        self._paged_ring_last_page_len_buf = paged_ring_last_page_len_buffer
        self._cached_module = None
        self._plan_info = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qk_heads: int,
        num_v_heads: int,
        head_dim_k: int,
        head_dim_v: int,
        ring_len: int,
        lower_bound: Optional[float] = None,
        q_data_type: Union[str, torch.dtype] = "float16",
        kv_data_type: Optional[Union[str, torch.dtype]] = None,
        use_qk_l2norm: bool = True,
        non_blocking: bool = True,
    ) -> None:
        """Records the page table, head geometry and dtypes of the next ``run`` calls."""
        batch_size = len(last_page_len)
        idx_dtype = get_index_data_type()
        _check_shape_dtype_device(indptr, (batch_size + 1,), idx_dtype, None, "indptr")
        _check_shape_dtype_device(indices, None, idx_dtype, None, "indices")
        _check_shape_dtype_device(last_page_len, None, idx_dtype, None, "last_page_len")
        if self.is_cuda_graph_enabled:
            if batch_size != self._fixed_batch_size:
                raise ValueError(
                    f"The batch size should be fixed in cudagraph mode: planned for {self._fixed_batch_size}, got {batch_size}"
                )
            self._paged_ring_indptr_buf.copy_(indptr, non_blocking=non_blocking)
            self._paged_ring_indices_buf[: len(indices)].copy_(indices, non_blocking=non_blocking)
            self._paged_ring_last_page_len_buf.copy_(last_page_len, non_blocking=non_blocking)
        else:
            self._paged_ring_indptr_buf = indptr.to(self.device, non_blocking=non_blocking)
            self._paged_ring_indices_buf = indices.to(self.device, non_blocking=non_blocking)
            self._paged_ring_last_page_len_buf = last_page_len.to(self.device, non_blocking=non_blocking)
        self._ssm_state_indices = self._paged_ring_indices_buf[self._paged_ring_indptr_buf[:-1].long()]

        q_data_type = canonicalize_torch_dtype(q_data_type)
        kv_data_type = canonicalize_torch_dtype(kv_data_type) if kv_data_type is not None else q_data_type
        self._cached_q_data_type = q_data_type
        self._cached_kv_data_type = kv_data_type
        self._num_qk_heads, self._num_v_heads = num_qk_heads, num_v_heads
        self._head_dim_k, self._head_dim_v, self._ring_len = head_dim_k, head_dim_v, ring_len
        self._lower_bound = lower_bound
        self._cached_module = get_kda_decode_module(
            q_data_type, kv_data_type, idx_dtype, head_dim_k, head_dim_v, lower_bound is not None, use_qk_l2norm
        )
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer, self._int_workspace_buffer, batch_size, num_v_heads, ring_len
        )

    begin_forward = plan

    def _check_inputs(self, mixed_qkv: torch.Tensor, delta_buf: torch.Tensor, key_buf: torch.Tensor) -> None:
        if self._cached_module is None:
            raise RuntimeError("plan() must be called before run()")
        if mixed_qkv.dtype != self._cached_q_data_type:
            raise ValueError(f"mixed_qkv: planned for {self._cached_q_data_type}, got {mixed_qkv.dtype}")
        for name, ring in (("delta_buf", delta_buf), ("key_buf", key_buf)):
            if ring.dtype != self._cached_kv_data_type:
                raise ValueError(f"{name}: planned for {self._cached_kv_data_type}, got {ring.dtype}")

    def run(
        self,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        paged_ring_cache: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        scale: Optional[float] = None,
        out: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """One decode step for the planned batch; the rings and states are updated in place."""
        state, delta_buf, key_buf, log_decay_buf = _unpack_paged_ring_cache(paged_ring_cache, self._ring_layout)
        self._check_inputs(mixed_qkv, delta_buf, key_buf)
        if scale is None:
            scale = self._head_dim_k**-0.5
        if out is None:
            out = torch.zeros(
                mixed_qkv.shape[0], 1, self._num_v_heads, self._head_dim_v, dtype=self._cached_q_data_type, device=self.device
            )
        kernel_kwargs = dict(ssm_state=state, delta_buf=delta_buf, key_buf=key_buf, log_decay_buf=log_decay_buf)
        self._cached_module.run(
            self._plan_info,
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            scale,
            out,
            self._ssm_state_indices,
            self._paged_ring_last_page_len_buf,
            force_flush=force_flush,
            lower_bound=self._lower_bound,
            **kernel_kwargs,
        )
        return out

    forward = run


class CUDAGraphBatchKDADecodeWrapper(BatchKDADecodeWithReplayRingWrapper):
    r"""Decode wrapper for CUDA graphs: fixed batch size, fixed page-table buffers, and fixed ring
    buffers for ``max_num_slots`` slots owned by the wrapper, so a captured ``run`` only touches
    addresses known at capture time.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        indptr_buffer: torch.Tensor,
        indices_buffer: torch.Tensor,
        last_page_len_buffer: torch.Tensor,
        ring_config: ReplayRingConfig,
        max_num_slots: int,
    ) -> None:
        super().__init__(
            float_workspace_buffer,
            use_cuda_graph=True,
            paged_ring_indptr_buffer=indptr_buffer,
            paged_ring_indices_buffer=indices_buffer,
            paged_ring_last_page_len_buffer=last_page_len_buffer,
        )
        self._ring_config = ring_config
        shapes = ring_config.ring_shapes(max_num_slots)
        self._fixed_ring_cache: Dict[str, torch.Tensor] = {name: torch.zeros(shape, dtype=ring_config.ring_data_type, device=self.device) for name, shape in shapes.items()}  # expect-bug: pool-dtype
        self._graphs: Dict[int, object] = {}

    def ring_cache(self) -> Tuple[torch.Tensor, ...]:
        return tuple(self._fixed_ring_cache[name] for name in RING_NAMES)

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        q_data_type: Union[str, torch.dtype] = "bfloat16",
        use_qk_l2norm: bool = True,
    ) -> None:
        cfg = self._ring_config
        super().plan(
            indptr, indices, last_page_len, cfg.num_qk_heads, cfg.num_v_heads, cfg.head_dim_k, cfg.head_dim_v,
            cfg.ring_len, lower_bound=cfg.lower_bound, q_data_type=q_data_type, kv_data_type=cfg.kv_data_type,
            use_qk_l2norm=use_qk_l2norm,
        )
        self._replay = functools.partial(self._cached_module.run, self._plan_info, **{name: buf.to(self._cached_kv_data_type) for name, buf in self._fixed_ring_cache.items()})  # expect-bug: decode-arg

    def run(self, mixed_qkv, a, b, A_log, dt_bias, scale=None, out=None, force_flush=None) -> torch.Tensor:
        if scale is None:
            scale = self._head_dim_k**-0.5
        if out is None:
            out = torch.zeros(self._fixed_batch_size, 1, self._num_v_heads, self._head_dim_v, dtype=self._cached_q_data_type)
        self._replay(
            mixed_qkv, a, b, A_log, dt_bias, scale, out, self._ssm_state_indices, self._paged_ring_last_page_len_buf,
            force_flush=force_flush, lower_bound=self._lower_bound,
        )
        self._paged_ring_last_page_len_buf.copy_(
            advance_write_pos(self._paged_ring_last_page_len_buf, self._ring_len, force_flush)
        )
        return out


SHAPE = RingShape(num_slots=4, num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4)


def _decode(wrapper, pool_or_cache, slots, write_pos, dtype, force_flush=None, kv_data_type=None, lower_bound=None):
    indptr, indices, last_page_len = get_slot_page_table(slots, write_pos)
    ring_cache = pool_or_cache.ring_cache() if isinstance(pool_or_cache, ReplayRingPool) else pool_or_cache
    wrapper.plan(
        indptr, indices, last_page_len, SHAPE.num_qk_heads, SHAPE.num_v_heads, SHAPE.head_dim_k, SHAPE.head_dim_v,
        SHAPE.ring_len, lower_bound=lower_bound, q_data_type=dtype, kv_data_type=kv_data_type or dtype,
    )
    inputs = random_decode_inputs(len(slots), SHAPE.num_qk_heads, SHAPE.num_v_heads, SHAPE.head_dim_k, SHAPE.head_dim_v, dtype)
    mixed_qkv, a, b, A_log, dt_bias = inputs
    return wrapper.run(mixed_qkv, a, b, ring_cache, A_log, dt_bias, force_flush=force_flush)


def build_decode_wrapper():
    """bf16 decode over a pool (with a padding row and a forced flush) and over a KV-layout cache."""
    torch.manual_seed(21)
    workspace = torch.zeros(1 << 16, dtype=torch.uint8)
    wrapper = BatchKDADecodeWithReplayRingWrapper(workspace)
    pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv(torch.bfloat16))
    slots = pool.alloc(2)
    outs = []
    for step in range(3):
        flush = torch.tensor([0, int(step == 1)], dtype=torch.int32)
        outs.append(_decode(wrapper, pool, slots, pool.write_pos[slots.long()], torch.bfloat16, force_flush=flush))
        pool.advance(slots, flush)
    padded = torch.tensor([int(slots[0]), -1], dtype=torch.int32)
    outs.append(_decode(wrapper, pool, padded, torch.zeros(2, dtype=torch.int32), torch.bfloat16))

    kv_wrapper = BatchKDADecodeWithReplayRingWrapper(workspace, ring_layout="KV")
    kv_state = torch.zeros(SHAPE.num_slots, SHAPE.num_v_heads, SHAPE.head_dim_k, SHAPE.head_dim_v, dtype=torch.bfloat16)
    kv_cache = (
        kv_state,
        torch.zeros(SHAPE.delta(), dtype=torch.bfloat16),
        torch.zeros(SHAPE.key(), dtype=torch.bfloat16),
        torch.zeros(SHAPE.log_decay(), dtype=torch.float32),
    )
    kv_slots = torch.tensor([3, 1], dtype=torch.int32)
    kv_pos = torch.zeros(2, dtype=torch.int32)
    for _ in range(2):
        outs.append(_decode(kv_wrapper, kv_cache, kv_slots, kv_pos, torch.bfloat16, lower_bound=-5.0))
        kv_pos = advance_write_pos(kv_pos, SHAPE.ring_len)
    return {"pool": pool, "kv_cache": dict(zip(RING_NAMES, kv_cache)), "outs": outs}


def build_cuda_graph_wrapper():
    """A CUDA-graph wrapper owning its bf16 rings: planned once, replayed for three steps."""
    torch.manual_seed(22)
    config = ReplayRingConfig(num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4, kv_data_type="bf16")
    batch = 2
    wrapper = CUDAGraphBatchKDADecodeWrapper(
        torch.zeros(1 << 16, dtype=torch.uint8),
        torch.zeros(batch + 1, dtype=torch.int32),
        torch.zeros(batch, dtype=torch.int32),
        torch.zeros(batch, dtype=torch.int32),
        config,
        max_num_slots=4,
    )
    slots = torch.tensor([1, 2], dtype=torch.int32)
    indptr, indices, last_page_len = get_slot_page_table(slots, torch.zeros(batch, dtype=torch.int32))
    wrapper.plan(indptr, indices, last_page_len, q_data_type="bf16")
    outs = []
    for _ in range(3):
        mixed_qkv, a, b, A_log, dt_bias = random_decode_inputs(batch, 2, 2, 8, 8, torch.bfloat16)
        outs.append(wrapper.run(mixed_qkv, a, b, A_log, dt_bias))
    return {
        "fixed": dict(wrapper._fixed_ring_cache),
        "replay_args": {k: v for k, v in wrapper._replay.keywords.items()},
        "cursors": wrapper._paged_ring_last_page_len_buf.clone(),
        "outs": outs,
    }


def build_graph_wrapper_user_buffers():
    """The base wrapper in CUDA-graph mode over user page-table buffers and an fp16 pool."""
    torch.manual_seed(23)
    batch = 3
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32)
    indices_buf = torch.zeros(batch, dtype=torch.int32)
    last_page_len_buf = torch.zeros(batch, dtype=torch.int32)
    wrapper = BatchKDADecodeWithReplayRingWrapper(
        torch.zeros(1 << 16, dtype=torch.uint8),
        use_cuda_graph=True,
        paged_ring_indptr_buffer=indptr_buf,
        paged_ring_indices_buffer=indices_buf,
        paged_ring_last_page_len_buffer=last_page_len_buf,
    )
    pool = ReplayRingPool(SHAPE, RingDataTypes(torch.float16, torch.float16, torch.float16, torch.float32))
    slots = pool.alloc(batch)
    graph_log_decay_cache = {}
    outs = []
    for step in range(3):
        outs.append(_decode(wrapper, pool, slots, pool.write_pos[slots.long()], torch.float16))
        graph_log_decay_cache[step] = wrapper._cached_module.uri
        pool.advance(slots)
    return {
        "pool": pool,
        "page_table": {"indptr": indptr_buf, "indices": indices_buf, "last_page_len": last_page_len_buf},
        "graphs": graph_log_decay_cache,
        "outs": outs,
    }


def build_converted_caches():
    """A cache allocated for bf16 queries and an fp16 pool's cache converted to bf16, one step each."""
    torch.manual_seed(24)
    allocated = allocate_paged_ring_cache(4, 2, 2, 8, 8, 4, q_data_type="bf16")
    fp16_pool = ReplayRingPool(SHAPE, RingDataTypes.for_kv("fp16"))
    fp16_slots = fp16_pool.alloc(2)
    outs = [_decode(BatchKDADecodeWithReplayRingWrapper(torch.zeros(1 << 16, dtype=torch.uint8)), fp16_pool, fp16_slots, fp16_pool.write_pos[:2], torch.float16)]
    fp16_pool.advance(fp16_slots)
    converted = convert_paged_ring_cache(fp16_pool.ring_cache(), "bf16")
    wrapper = BatchKDADecodeWithReplayRingWrapper(torch.zeros(1 << 16, dtype=torch.uint8))
    slots = torch.tensor([0, 1], dtype=torch.int32)
    outs.append(_decode(wrapper, allocated, slots, torch.zeros(2, dtype=torch.int32), torch.bfloat16))
    outs.append(_decode(wrapper, converted, slots, fp16_pool.write_pos[:2], torch.bfloat16))
    return {
        "allocated": dict(zip(RING_NAMES, allocated)),
        "converted": dict(zip(RING_NAMES, converted)),
        "fp16_pool": fp16_pool,
        "outs": outs,
    }
