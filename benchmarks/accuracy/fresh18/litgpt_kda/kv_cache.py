# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Replay caches: the per-layer decode state of Kimi Delta Attention.

A layer's cache holds, per slot (sequence), a checkpoint state ``[HV, V, K]`` and three rings of
``ring_len`` rows: the deltas ``[HV, L, V]``, the normalised keys ``[H, L, K]`` and the per-step
log-decays ``[HV, L, K]``. The state and the delta/key rings are stored in the model's dtype. The
log-decays are summed and exponentiated when the state is replayed, so they are kept in float32.
"""

import functools
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
import torch.nn as nn

from litgpt_kda.ops import advance_write_pos


class ReplayCache(nn.Module):
    float_buffers = ("state", "delta_cache", "key_cache", "logdecay_cache")

    def __init__(
        self,
        n_slots: int,
        n_key_heads: int,
        n_value_heads: int,
        key_dim: int,
        value_dim: int,
        ring_len: int,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        logdecay_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        # persistent, so that a paused decode can be resumed from a checkpoint
        self.register_buffer(
            "state", torch.zeros(n_slots, n_value_heads, value_dim, key_dim, device=device, dtype=dtype)
        )
        self.register_buffer(
            "delta_cache", torch.zeros(n_slots, n_value_heads, ring_len, value_dim, device=device, dtype=dtype)
        )
        self.register_buffer(
            "key_cache", torch.zeros(n_slots, n_key_heads, ring_len, key_dim, device=device, dtype=dtype)
        )
        self.register_buffer(
            "logdecay_cache",
            torch.zeros(n_slots, n_value_heads, ring_len, key_dim, device=device, dtype=logdecay_dtype),
        )
        self.register_buffer("write_pos", torch.zeros(n_slots, device=device, dtype=torch.int32))

    @classmethod
    def from_tensors(
        cls,
        state: torch.Tensor,
        delta_cache: torch.Tensor,
        key_cache: torch.Tensor,
        logdecay_cache: torch.Tensor,
        write_pos: torch.Tensor,
    ) -> "ReplayCache":
        """A cache over existing tensors (no copy), e.g. views into a :class:`ReplayCachePool`."""
        cache = cls.__new__(cls)
        nn.Module.__init__(cache)
        for name, tensor in zip(
            ("state", "delta_cache", "key_cache", "logdecay_cache", "write_pos"),
            (state, delta_cache, key_cache, logdecay_cache, write_pos),
        ):
            cache.register_buffer(name, tensor)
        return cache

    @classmethod
    def from_state(cls, state: torch.Tensor, n_key_heads: int, ring_len: int) -> "ReplayCache":
        """A cache whose checkpoints are ``state`` (``[slots, HV, V, K]``) and whose rings are empty.

        Used to continue from states computed elsewhere, e.g. by a chunked prefill kernel.
        """
        n_slots, n_value_heads, value_dim, key_dim = state.shape
        delta_cache = state.new_zeros(n_slots, n_value_heads, ring_len, value_dim)
        key_cache = state.new_zeros(n_slots, n_key_heads, ring_len, key_dim)
        logdecay_cache = state.new_zeros(n_slots, n_value_heads, ring_len, key_dim)  # expect-bug: like
        write_pos = torch.zeros(n_slots, dtype=torch.int32, device=state.device)
        return cls.from_tensors(state, delta_cache, key_cache, logdecay_cache, write_pos)

    @property
    def n_slots(self) -> int:
        return self.state.shape[0]

    @property
    def ring_len(self) -> int:
        return self.delta_cache.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.state.dtype

    @property
    def group(self) -> int:
        return self.state.shape[1] // self.key_cache.shape[1]

    def advance(self, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> None:
        """Moves the cursors of ``slots`` after a decode step."""
        slots = slots.long()
        self.write_pos[slots] = advance_write_pos(self.write_pos[slots], self.ring_len, force_flush)

    def materialize_state(self) -> torch.Tensor:
        """Every slot's state with its ring rows folded in, ``[slots, HV, V, K]`` in float32."""
        rows = torch.arange(self.ring_len, device=self.write_pos.device)
        valid = (rows[None, :] < self.write_pos[:, None].long())[:, None, :, None]
        G = (self.logdecay_cache.float() * valid).cumsum(2)
        G_T = G[:, :, -1]
        keys = self.key_cache.float().repeat_interleave(self.group, dim=1)
        weights = torch.exp(G_T[:, :, None] - G) * keys * valid
        replayed = torch.einsum("shlv,shlk->shvk", self.delta_cache.float(), weights)
        return self.state.float() * torch.exp(G_T)[:, :, None, :] + replayed

    def flush_(self) -> None:
        """Writes every slot's replayed state into its checkpoint and empties the rings."""
        self.state.copy_(self.materialize_state())
        self.write_pos.zero_()

    def resize(self, ring_len: int) -> None:
        """Changes the ring length. Rows already written are folded into the checkpoints first."""
        if ring_len == self.ring_len:
            return
        self.flush_()
        n_slots, n_value_heads, _, value_dim = self.delta_cache.shape
        n_key_heads, key_dim = self.key_cache.shape[1], self.key_cache.shape[3]
        device = self.state.device
        self.delta_cache = self.delta_cache.new_zeros(n_slots, n_value_heads, ring_len, value_dim)
        self.key_cache = self.key_cache.new_zeros(n_slots, n_key_heads, ring_len, key_dim)
        self.logdecay_cache = torch.zeros(n_slots, n_value_heads, ring_len, key_dim, device=device)  # expect-bug: default-dtype

    def save_snapshot(self, path: Union[str, Path]) -> None:
        """Writes the cache to an ``.npz`` archive, readable without torch.

        numpy has no bfloat16, so floating point buffers are widened to float32 on the way out.
        """
        arrays = {}
        for name, buffer in self.named_buffers():
            buffer = buffer.detach().cpu()
            arrays[name] = (buffer.float() if buffer.is_floating_point() else buffer).numpy()
        np.savez(path, **arrays)

    def load_snapshot(self, path: Union[str, Path]) -> None:
        """Restores a cache written by :meth:`save_snapshot`. Slot count and ring length may differ."""
        device = self.state.device
        with np.load(path) as archive:
            for name in [name for name, _ in self.named_buffers()]:
                array = archive[name]
                dtype = self.dtype if array.dtype == np.float32 else None
                setattr(self, name, torch.from_numpy(array).to(device=device, dtype=dtype))  # expect-bug: load


class ReplayCachePool:
    """One allocation for the replay caches of every layer, handed out as per-layer views.

    Keeping the layers in one tensor per buffer lets a scheduler move or zero a slot across all
    layers with a single indexing operation.
    """

    def __init__(
        self,
        n_layer: int,
        n_slots: int,
        n_key_heads: int,
        n_value_heads: int,
        key_dim: int,
        value_dim: int,
        ring_len: int,
        device: Optional[torch.device] = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.n_layer, self.n_slots, self.ring_len, self.dtype = n_layer, n_slots, ring_len, dtype
        alloc = functools.partial(torch.zeros, device=device, dtype=dtype)  # expect-bug: pool-dtype id=pool-alloc
        self.state = alloc(n_layer, n_slots, n_value_heads, value_dim, key_dim)
        self.delta = alloc(n_layer, n_slots, n_value_heads, ring_len, value_dim)
        self.key = alloc(n_layer, n_slots, n_key_heads, ring_len, key_dim)
        self.logdecay = alloc(n_layer, n_slots, n_value_heads, ring_len, key_dim)  # expect-bug: pool-dtype id=pool-alloc
        self.write_pos = torch.zeros(n_layer, n_slots, device=device, dtype=torch.int32)

    @classmethod
    def from_config(cls, config, n_slots: int, device=None, dtype: torch.dtype = torch.bfloat16) -> "ReplayCachePool":
        return cls(
            config.n_layer,
            n_slots,
            config.n_head,
            config.n_value_head,
            config.head_size,
            config.value_head_size,
            config.ring_len,
            device=device,
            dtype=dtype,
        )

    def layer_cache(self, layer: int) -> ReplayCache:
        return ReplayCache.from_tensors(
            self.state[layer], self.delta[layer], self.key[layer], self.logdecay[layer], self.write_pos[layer]
        )

    def bind(self, model: nn.Module) -> None:
        """Points every layer's ``kv_cache`` of ``model`` at its view of the pool."""
        for i, block in enumerate(model.transformer.h):
            block.attn.kv_cache = self.layer_cache(i)

    def release(self, slots: torch.Tensor) -> None:
        """Empties ``slots`` in every layer so that they can be reused for new sequences."""
        slots = slots.long()
        for tensor in (self.state, self.delta, self.key, self.logdecay):
            tensor[:, slots] = 0
        self.write_pos[:, slots] = 0


def build_replay_cache():
    """A bf16 cache stepped through a flush by the kernel, then folded and lengthened."""
    from litgpt_kda.ops import kda_replay_decode

    torch.manual_seed(0)
    B, H, HV, K, V, L = 2, 1, 2, 8, 8, 3
    cache = ReplayCache(B, H, HV, K, V, L, dtype=torch.bfloat16)
    A_log, dt_bias = torch.zeros(HV), torch.zeros(HV, K)
    slots = torch.arange(B, dtype=torch.int32)
    for _ in range(4):
        out = torch.zeros(B, 1, HV, V, dtype=torch.bfloat16)
        kda_replay_decode(
            torch.randn(B, 2 * H * K + HV * V), torch.randn(B, HV, K), torch.randn(B, HV),
            A_log, dt_bias, K**-0.5, cache.state, cache.delta_cache, cache.key_cache,
            g_cache=cache.logdecay_cache, out=out, ssm_state_indices=slots,
            write_pos=cache.write_pos.clone(),
        )
        cache.advance(slots)
    folded = cache.materialize_state()
    longer = ReplayCache.from_tensors(*(t.clone() for t in cache.buffers()))
    longer.logdecay_cache = longer.logdecay_cache.new_zeros(B, HV, 2 * L, K)
    longer.logdecay_cache[:, :, :L] = cache.logdecay_cache
    return {"cache": cache, "folded": folded, "longer_logdecay": longer.logdecay_cache, "out": out}


def build_pooled_caches():
    """A bf16 pool bound to a tiny model's layers, plus caches continued from precomputed states."""
    from litgpt_kda.config import Config
    from litgpt_kda.model import GPT

    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny")
    model = GPT(config).to(torch.bfloat16)
    pool = ReplayCachePool.from_config(config, n_slots=2, dtype=torch.bfloat16)
    pool.bind(model)
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    logits = model(idx)
    states = torch.randn(2, config.n_value_head, config.value_head_size, config.head_size).to(torch.bfloat16)
    continued = ReplayCache.from_state(states, config.n_head, config.ring_len)
    return {"pool": vars(pool), "logits": logits, "continued": continued}


def build_restored_cache():
    """A cache written to an ``.npz`` snapshot and restored into a cache with a longer ring."""
    import tempfile

    torch.manual_seed(0)
    cache = ReplayCache(2, 1, 2, 8, 8, 4, dtype=torch.bfloat16)
    cache.delta_cache.normal_()
    cache.key_cache.normal_()
    cache.logdecay_cache.uniform_(-1.0, 0.0)
    cache.write_pos.fill_(2)
    restored = ReplayCache(2, 1, 2, 8, 8, 8, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp_dir:
        path = Path(tmp_dir) / "slot_cache.npz"
        cache.save_snapshot(path)
        restored.load_snapshot(path)
    return {"cache": cache, "restored": restored}
