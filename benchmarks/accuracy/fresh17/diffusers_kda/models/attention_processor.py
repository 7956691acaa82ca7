"""Kimi Delta Attention with ReplaySSM decoding: the attention module, its processors and the kernel."""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..utils import logging
from ..utils.torch_utils import get_replay_cache_dtypes, maybe_allow_in_graph

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# kernel (pure PyTorch stand-in for the sglang-compatible fused kernel)
# ---------------------------------------------------------------------------------------------


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
):
    """One ReplaySSM decode step for every row of the batch.

    Rebuilds each slot's state from its checkpoint ``initial_state[slot]`` and the ring rows before
    the row's cursor, produces ``out`` and either appends one row to the rings or, on a flush, writes
    the new state back into the checkpoint. Math runs in float32; results are written back into the
    given tensors with ``copy_`` whatever their dtype. Returns ``(out, initial_state)``.
    """
    batch = mixed_qkv.shape[0]
    num_v_heads, head_v_dim, head_k_dim = initial_state.shape[1:]
    num_k_heads = k_cache.shape[1]
    ring_len = d_cache.shape[2]
    group = num_v_heads // num_k_heads
    qkv = mixed_qkv.float()
    q = qkv[:, : num_k_heads * head_k_dim].reshape(batch, num_k_heads, head_k_dim)
    k = qkv[:, num_k_heads * head_k_dim : 2 * num_k_heads * head_k_dim].reshape(batch, num_k_heads, head_k_dim)
    v = qkv[:, 2 * num_k_heads * head_k_dim :].reshape(batch, num_v_heads, head_v_dim)
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    x = a.float().reshape(batch, num_v_heads, head_k_dim) + dt_bias.float().reshape(num_v_heads, head_k_dim)
    decay_rate = A_log.float().exp().reshape(num_v_heads, 1)
    if lower_bound is None:
        g = -decay_rate * F.softplus(x)
    else:
        g = lower_bound * torch.sigmoid(decay_rate * x)
    beta = torch.sigmoid(b.float().reshape(batch, num_v_heads))
    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        for hv in range(num_v_heads):
            h = hv // group
            state = initial_state[slot, hv].float()
            if cursor:
                prefix = g_cache[slot, hv, :cursor].float().cumsum(0)
                total = prefix[-1]
                weights = torch.exp(total - prefix) * k_cache[slot, h, :cursor].float()
                state = state * torch.exp(total)[None, :] + d_cache[slot, hv, :cursor].float().t() @ weights
            alpha = g[row, hv].exp()
            q_s = scale * q[row, h]
            decayed = state * alpha[None, :]
            delta = beta[row, hv] * (v[row, hv] - decayed @ k[row, h])
            out[row, 0, hv].copy_(decayed @ q_s + delta * (k[row, h] @ q_s))
            if flush:
                initial_state[slot, hv].copy_(decayed + delta[:, None] * k[row, h][None, :])
            else:
                d_cache[slot, hv, cursor].copy_(delta)
                g_cache[slot, hv, cursor].copy_(g[row, hv])
                if hv % group == 0:
                    k_cache[slot, h, cursor].copy_(k[row, h])
    return out, initial_state


def next_write_pos(write_pos: torch.Tensor, ring_len: int, force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The cursors after one decode step: 0 after a flush, else one further."""
    flushed = write_pos == ring_len - 1
    if force_flush is not None:
        flushed = flushed | (force_flush != 0)
    return torch.where(flushed, torch.zeros_like(write_pos), write_pos + 1).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# attention module
# ---------------------------------------------------------------------------------------------


@maybe_allow_in_graph
class KDAAttention(nn.Module):
    r"""Kimi Delta Attention for single-token decoding.

    Parameters:
        query_dim (`int`): number of channels of the hidden states.
        heads (`int`): number of query/key heads.
        value_heads (`int`, *optional*): number of value heads (a multiple of ``heads``).
        dim_head (`int`): channels per head, for keys and values alike.
        lower_bound (`float`, *optional*): bounded gate ``lb * sigmoid(A * x)`` instead of ``-A * softplus(x)``.
        processor (*optional*): the attention processor; [`KDAReplayCacheProcessor`] by default.
    """

    def __init__(
        self,
        query_dim: int,
        heads: int = 2,
        value_heads: Optional[int] = None,
        dim_head: int = 8,
        lower_bound: Optional[float] = None,
        processor: Optional[Any] = None,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.value_heads = value_heads or heads
        self.dim_head = dim_head
        self.scale = dim_head**-0.5
        self.lower_bound = lower_bound
        inner_qk, inner_v = heads * dim_head, self.value_heads * dim_head
        self.to_qkv = nn.Linear(query_dim, 2 * inner_qk + inner_v, bias=False)
        self.to_a = nn.Linear(query_dim, inner_v, bias=False)
        self.to_b = nn.Linear(query_dim, self.value_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, self.value_heads)))
        self.dt_bias = nn.Parameter(0.1 * torch.randn(inner_v))
        self.to_out = nn.Linear(inner_v, query_dim, bias=False)
        self.set_processor(processor if processor is not None else KDAReplayCacheProcessor())

    def cache_shapes(self, num_slots: int, ring_len: int) -> Dict[str, tuple]:
        """Shapes of one layer's replay caches for ``num_slots`` slots and a ring of ``ring_len`` rows."""
        return {
            "checkpoint_state": (num_slots, self.value_heads, self.dim_head, self.dim_head),
            "delta_ring": (num_slots, self.value_heads, ring_len, self.dim_head),
            "key_ring": (num_slots, self.heads, ring_len, self.dim_head),
            "log_decay_ring": (num_slots, self.value_heads, ring_len, self.dim_head),
        }

    def set_processor(self, processor: Any) -> None:
        self.processor = processor

    def get_processor(self) -> Any:
        return self.processor

    def forward(self, hidden_states: torch.Tensor, **cross_attention_kwargs: Any) -> torch.Tensor:
        return self.processor(self, hidden_states, **cross_attention_kwargs)


def _replay_decode(
    attn: KDAAttention,
    hidden_states: torch.Tensor,
    caches: Any,
    slot_ids: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
    kernel: Callable = fused_recurrent_kda_replayssm_decode,
    **kernel_kwargs: Any,
) -> torch.Tensor:
    """Runs the kernel on ``caches`` (anything with the ring attributes) and advances their cursors."""
    batch = hidden_states.shape[0]
    mixed_qkv = attn.to_qkv(hidden_states)
    a = attn.to_a(hidden_states)
    b = attn.to_b(hidden_states)
    out = hidden_states.new_empty((batch, 1, attn.value_heads, attn.dim_head))
    valid = slot_ids >= 0
    write_pos = torch.where(valid, caches.write_pos[slot_ids.clamp(min=0).long()], torch.zeros_like(slot_ids))
    ring_len = caches.delta_ring.shape[2]
    if not kernel_kwargs:
        kernel_kwargs = {
            "initial_state": caches.checkpoint_state,
            "d_cache": caches.delta_ring,
            "k_cache": caches.key_ring,
            "g_cache": caches.log_decay_ring,
        }
    kernel(
        mixed_qkv,
        a,
        b,
        attn.A_log,
        attn.dt_bias,
        attn.scale,
        out=out,
        ssm_state_indices=slot_ids,
        write_pos=write_pos,
        force_flush=force_flush,
        lower_bound=attn.lower_bound,
        **kernel_kwargs,
    )
    advanced = next_write_pos(write_pos, ring_len, force_flush)
    caches.write_pos[slot_ids[valid].long()] = advanced[valid]
    return attn.to_out(out.reshape(batch, -1))


# ---------------------------------------------------------------------------------------------
# processors
# ---------------------------------------------------------------------------------------------


class KDAReplayCacheProcessor:
    r"""Processor for models that keep the replay caches themselves and pass them in per call
    (``replay_cache=...``)."""

    def __call__(
        self,
        attn: KDAAttention,
        hidden_states: torch.Tensor,
        replay_cache: Any = None,
        slot_ids: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if replay_cache is None:
            raise ValueError("KDAReplayCacheProcessor needs `replay_cache`")
        if slot_ids is None:
            slot_ids = torch.arange(hidden_states.shape[0], dtype=torch.int32, device=hidden_states.device)
        return _replay_decode(attn, hidden_states, replay_cache, slot_ids, force_flush)


class KDAReplayProcessor:
    r"""Processor that owns the replay caches of one attention layer.

    Args:
        num_slots (`int`): number of sequences the caches hold.
        ring_len (`int`): ring rows per slot; a slot is checkpointed every ``ring_len`` steps.
        dtype (`torch.dtype`): dtype of the checkpoint state and of the delta/key rings.
        compact (`bool`): use the compact cache layout of ``get_replay_cache_dtypes``.
    """

    def __init__(self, num_slots: int = 2, ring_len: int = 4, dtype: torch.dtype = torch.float32, device=None, compact: bool = False) -> None:
        self.num_slots = num_slots
        self.ring_len = ring_len
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.compact = compact
        self.checkpoint_state: Optional[torch.Tensor] = None

    def allocate(self, attn: KDAAttention) -> None:
        shapes = attn.cache_shapes(self.num_slots, self.ring_len)
        dtypes = get_replay_cache_dtypes(self.dtype, compact=self.compact)
        self.checkpoint_state = torch.zeros(shapes["checkpoint_state"], dtype=self.dtype, device=self.device)
        self.delta_ring = torch.zeros(shapes["delta_ring"], dtype=dtypes.delta, device=self.device)
        self.key_ring = torch.zeros(shapes["key_ring"], dtype=dtypes.key, device=self.device)
        self.log_decay_ring = torch.zeros(shapes["log_decay_ring"], dtype=dtypes.log_decay, device=self.device)  # expect-bug: imported-policy id=compact-policy
        self.write_pos = torch.zeros(self.num_slots, dtype=torch.int32, device=self.device)

    def __call__(
        self,
        attn: KDAAttention,
        hidden_states: torch.Tensor,
        slot_ids: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
        **unused: Any,
    ) -> torch.Tensor:
        if self.checkpoint_state is None:
            self.allocate(attn)
        if slot_ids is None:
            slot_ids = torch.arange(hidden_states.shape[0], dtype=torch.int32, device=hidden_states.device)
        return _replay_decode(attn, hidden_states, self, slot_ids, force_flush)

    # -- moving and reshaping the caches ----------------------------------------------------------

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "KDAReplayProcessor":
        """Moves the caches; ``dtype`` applies to the state and the delta/key rings."""
        dtype = dtype or self.dtype
        self.checkpoint_state = self.checkpoint_state.to(device=device, dtype=dtype)
        self.delta_ring = self.delta_ring.to(device=device, dtype=dtype)
        self.key_ring = self.key_ring.to(device=device, dtype=dtype)
        self.log_decay_ring = self.log_decay_ring.to(device=device)
        self.write_pos = self.write_pos.to(device=device)
        self.dtype = dtype
        if device is not None:
            self.device = torch.device(device)
        return self

    def adopt(self, other: "KDAReplayProcessor") -> None:
        """Takes over the caches of ``other`` (e.g. when ``set_attn_processor`` swaps processors)."""
        self.num_slots, self.ring_len = other.num_slots, other.ring_len
        self.checkpoint_state = other.checkpoint_state.to(self.dtype)
        self.delta_ring = other.delta_ring.to(self.dtype)
        self.key_ring = other.key_ring.to(self.dtype)
        self.log_decay_ring = other.log_decay_ring.to(self.dtype)  # expect-bug: cast
        self.write_pos = other.write_pos.clone()

    def resize(self, num_slots: int) -> None:
        """Grows the caches to ``num_slots`` slots; existing slots keep their contents."""
        old = self.num_slots
        state = self.checkpoint_state.new_zeros((num_slots, *self.checkpoint_state.shape[1:]))
        delta_ring = self.delta_ring.new_zeros((num_slots, *self.delta_ring.shape[1:]))
        key_ring = self.key_ring.new_zeros((num_slots, *self.key_ring.shape[1:]))
        log_decay_ring = self.delta_ring.new_zeros((num_slots, *self.log_decay_ring.shape[1:]))  # expect-bug: like
        write_pos = self.write_pos.new_zeros(num_slots)
        for new, current in ((state, self.checkpoint_state), (delta_ring, self.delta_ring), (key_ring, self.key_ring), (log_decay_ring, self.log_decay_ring), (write_pos, self.write_pos)):
            new[:old].copy_(current[:old])
        self.checkpoint_state, self.delta_ring, self.key_ring = state, delta_ring, key_ring
        self.log_decay_ring, self.write_pos = log_decay_ring, write_pos
        self.num_slots = num_slots

    # -- snapshots ---------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {
            "checkpoint_state": self.checkpoint_state,
            "delta_ring": self.delta_ring,
            "key_ring": self.key_ring,
            "log_decay_ring": self.log_decay_ring,
            "write_pos": self.write_pos,
        }

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Copies a snapshot into the existing caches; every cache keeps its dtype."""
        for name, current in self.state_dict().items():
            current.copy_(state[name])

    def fingerprint(self) -> str:
        """A digest of the raw bytes of every cache, to compare snapshots cheaply."""
        digest = hashlib.sha256()
        for tensor in self.state_dict().values():
            digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:16]

    def offload_slots(self, path: str) -> None:
        """Swaps the caches out to ``path`` (float caches stored as float16 to halve host memory)."""
        arrays = {name: tensor.detach().cpu().float().numpy() for name, tensor in self.state_dict().items() if tensor.is_floating_point()}
        np.savez(path, write_pos=self.write_pos.cpu().numpy(), **{name: array.astype(np.float16) for name, array in arrays.items()})
        self.checkpoint_state = None

    def reload_slots(self, path: str) -> None:
        """Swaps caches written by ``offload_slots`` back in."""
        with np.load(path if path.endswith(".npz") else path + ".npz") as archive:
            self.checkpoint_state = torch.from_numpy(archive["checkpoint_state"]).to(self.device, self.dtype)
            self.delta_ring = torch.from_numpy(archive["delta_ring"]).to(self.device, self.dtype)
            self.key_ring = torch.from_numpy(archive["key_ring"]).to(self.device, self.dtype)
            self.log_decay_ring = torch.from_numpy(archive["log_decay_ring"]).to(self.device)  # expect-bug: load
            self.write_pos = torch.from_numpy(archive["write_pos"]).to(self.device)


class StaticKDAReplayProcessor(KDAReplayProcessor):
    r"""A [`KDAReplayProcessor`] with fixed kernel inputs, for ``torch.compile`` with static shapes.

    The kernel arguments are gathered into ``static_inputs`` once; compiled step functions are
    cached per batch size in ``gate_cache``.
    """

    def allocate(self, attn: KDAAttention) -> None:
        super().allocate(attn)
        self.static_inputs = {
            "initial_state": self.checkpoint_state,
            "d_cache": self.delta_ring,
            "k_cache": self.key_ring,
            "g_cache": self.log_decay_ring.to(self.dtype),  # expect-bug: decode-arg
        }
        self.gate_cache: Dict[int, Callable] = {}

    def _step_fn(self, batch: int) -> Callable:
        if batch not in self.gate_cache:
            self.gate_cache[batch] = functools.partial(fused_recurrent_kda_replayssm_decode, use_qk_l2norm_in_kernel=True)
        return self.gate_cache[batch]

    def __call__(self, attn, hidden_states, slot_ids=None, force_flush=None, **unused):
        if self.checkpoint_state is None:
            self.allocate(attn)
        if slot_ids is None:
            slot_ids = torch.arange(hidden_states.shape[0], dtype=torch.int32, device=hidden_states.device)
        kernel = self._step_fn(hidden_states.shape[0])
        return _replay_decode(attn, hidden_states, self, slot_ids, force_flush, kernel, **self.static_inputs)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------


def _decode_tokens(attn: KDAAttention, steps: int, batch: int, dtype: torch.dtype, flush_at: Optional[int] = None, **kwargs: Any):
    generator = torch.Generator().manual_seed(1)
    outputs = []
    for step in range(steps):
        hidden = torch.randn(batch, attn.to_qkv.in_features, generator=generator).to(dtype)
        force = None
        if flush_at is not None:
            force = torch.tensor([int(step == flush_at)] * batch, dtype=torch.int32)
        outputs.append(attn(hidden, force_flush=force, **kwargs))
    return outputs


def build_replay_processor(tmp_dir):
    """bf16 attention with processor-owned caches: decode, swap dtypes, checkpoint and restore."""
    torch.manual_seed(0)
    attn = KDAAttention(16, heads=2, value_heads=4, dim_head=8).to(torch.bfloat16)
    processor = KDAReplayProcessor(num_slots=3, ring_len=4, dtype=torch.bfloat16)
    attn.set_processor(processor)
    slot_ids = torch.tensor([0, -1, 2], dtype=torch.int32)
    outputs = _decode_tokens(attn, 3, 3, torch.bfloat16, flush_at=1, slot_ids=slot_ids)
    snapshot_path = os.path.join(tmp_dir, "replay_slots.pt")
    torch.save({name: tensor.clone() for name, tensor in processor.state_dict().items()}, snapshot_path)
    _decode_tokens(attn, 1, 3, torch.bfloat16, slot_ids=slot_ids)
    processor.load_state_dict(torch.load(snapshot_path, weights_only=True))
    processor.to(device="cpu", dtype=torch.float16)
    fingerprint = processor.fingerprint()
    return {"processor": processor, "outputs": outputs, "attn": attn, "fingerprint": fingerprint}


def build_compact_processors():
    """Compact and static processors side by side on one fp16 attention module."""
    torch.manual_seed(0)
    attn = KDAAttention(16, heads=2, value_heads=4, dim_head=8).half()
    compact = KDAReplayProcessor(num_slots=2, ring_len=4, dtype=torch.float16, compact=True)
    attn.set_processor(compact)
    compact_out = _decode_tokens(attn, 2, 2, torch.float16)
    static = StaticKDAReplayProcessor(num_slots=2, ring_len=4, dtype=torch.float16)
    attn.set_processor(static)
    static_out = _decode_tokens(attn, 3, 2, torch.float16)
    return {"compact": compact, "static": static, "outputs": compact_out + static_out}


def build_migrated_processor(tmp_dir):
    """Decode in float32, hand the caches to a bf16 processor, grow another one, and swap the first out and in."""
    torch.manual_seed(0)
    attn = KDAAttention(16, heads=2, value_heads=4, dim_head=8)
    warm = KDAReplayProcessor(num_slots=2, ring_len=4)
    attn.set_processor(warm)
    _decode_tokens(attn, 2, 2, torch.float32)
    attn = attn.to(torch.bfloat16)
    served = KDAReplayProcessor(num_slots=2, ring_len=4, dtype=torch.bfloat16)
    served.adopt(warm)
    attn.set_processor(served)
    outputs = _decode_tokens(attn, 1, 2, torch.bfloat16)
    grown = KDAReplayProcessor(num_slots=2, ring_len=4, dtype=torch.bfloat16)
    attn.set_processor(grown)
    outputs += _decode_tokens(attn, 1, 2, torch.bfloat16)
    grown.resize(3)
    outputs += _decode_tokens(attn, 2, 3, torch.bfloat16)
    swap_path = os.path.join(tmp_dir, "swap.npz")
    warm.offload_slots(swap_path)
    warm.reload_slots(swap_path)
    return {"warm": warm, "served": served, "grown": grown, "outputs": outputs}


def build_grown_fp32_processor():
    """A float32 processor resized and moved, next to a bf16 one that keeps float32 log-decays."""
    torch.manual_seed(0)
    attn = KDAAttention(16, heads=2, value_heads=4, dim_head=8)
    processor = KDAReplayProcessor(num_slots=2, ring_len=4)
    attn.set_processor(processor)
    _decode_tokens(attn, 2, 2, torch.float32)
    processor.resize(4)
    _decode_tokens(attn, 1, 4, torch.float32)
    low = KDAReplayProcessor(num_slots=4, ring_len=4, dtype=torch.bfloat16)
    low.allocate(attn)
    low.load_state_dict(processor.state_dict())
    return {"fp32": processor, "bf16": low}
