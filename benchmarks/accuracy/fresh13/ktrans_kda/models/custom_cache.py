"""``StaticCache``-style container of the per-layer ReplaySSM caches of a Kimi-Linear model.

Per layer ``l``: ``ssm_states[l]`` ``[slots, HV, V, K]`` (checkpoint state), ``delta_cache[l]``
``[slots, HV, L, V]`` and ``key_cache[l]`` ``[slots, H, L, K]`` in the cache dtype, and
``alpha_log_cache[l]`` ``[slots, HV, L, K]`` with the per-step log-decays in float32.
``write_pos`` ``[slots]`` (int32) is the ring cursor shared by all layers of a slot.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..operators.kda import fused_recurrent_kda_replayssm_decode as replay_decode
from ..operators.kda import random_decode_batch
from ..util.custom_gguf import DiskPrefixStore
from ..util.utils import advance_write_pos
from .configuration_kimi_linear import KDACacheSpec, KimiLinearConfig, OffloadRingDtypes

RING_KINDS = ("state", "delta", "key", "alpha_log")


class KDAStaticCache:
    def __init__(
        self,
        config: KimiLinearConfig,
        max_batch_size: Optional[int] = None,
        device: str = "cpu",
        dtype: Optional[torch.dtype] = None,
        spec: Optional[KDACacheSpec] = None,
    ) -> None:
        self.config = config
        self.max_batch_size = max_batch_size or config.max_batch_size
        self.device = str(device)
        self.dtype = dtype or config.model_torch_dtype
        self.spec = spec or KDACacheSpec(self.dtype, self.dtype, self.dtype)
        self.ring_len = config.replay_ring_len
        self.ssm_states: list[Optional[torch.Tensor]] = []
        self.delta_cache: list[Optional[torch.Tensor]] = []
        self.key_cache: list[Optional[torch.Tensor]] = []
        self.alpha_log_cache: list[Optional[torch.Tensor]] = []
        for layer_idx in range(config.num_hidden_layers):
            self._allocate_layer(layer_idx)
        self.write_pos = torch.zeros(self.max_batch_size, dtype=torch.int32, device=self.device)
        self.host_rings: dict[int, dict[str, torch.Tensor]] = {}

    # -- allocation -----------------------------------------------------------------------

    def _allocate_layer(self, layer_idx: int) -> None:
        shapes = self.config.ring_shapes(self.max_batch_size)
        self.ssm_states.append(torch.zeros(shapes["state"], dtype=self.spec.state_dtype, device=self.device))
        self.delta_cache.append(torch.zeros(shapes["delta"], dtype=self.spec.delta_dtype, device=self.device))
        self.key_cache.append(torch.zeros(shapes["key"], dtype=self.spec.key_dtype, device=self.device))
        self.alpha_log_cache.append(
            torch.zeros(shapes["alpha_log"], dtype=self.spec.alpha_log_dtype, device=self.device)
        )

    def _layer_rings(self, layer_idx: int) -> dict[str, Optional[torch.Tensor]]:
        return {
            "state": self.ssm_states[layer_idx],
            "delta": self.delta_cache[layer_idx],
            "key": self.key_cache[layer_idx],
            "alpha_log": self.alpha_log_cache[layer_idx],
        }

    def get_max_batch_size(self) -> int:
        return self.max_batch_size

    # -- decode ---------------------------------------------------------------------------

    def launch_args(self, layer_idx: int) -> dict[str, torch.Tensor]:
        """The ring arguments of the decode kernel for one layer."""
        return {
            "initial_state": self.ssm_states[layer_idx],
            "d_cache": self.delta_cache[layer_idx],
            "k_cache": self.key_cache[layer_idx],
            "g_cache": self.alpha_log_cache[layer_idx],
        }

    def step(self, layer_idx, mixed_qkv, a, b, A_log, dt_bias, scale, slot_ids, force_flush=None, lower_bound=None):
        """One decode step of ``layer_idx`` for the rows of ``slot_ids`` (-1: padding)."""
        out = torch.zeros(
            mixed_qkv.shape[0], 1, self.config.num_value_heads, self.config.v_head_dim,
            dtype=mixed_qkv.dtype, device=mixed_qkv.device,
        )
        write_pos = self.write_pos[slot_ids.clamp(min=0).long()]
        replay_decode(
            mixed_qkv, a, b, A_log, dt_bias, scale,
            out=out, ssm_state_indices=slot_ids, write_pos=write_pos, force_flush=force_flush,
            lower_bound=lower_bound, **self.launch_args(layer_idx),
        )
        return out

    def advance(self, slot_ids: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> None:
        """Moves the cursors of the (non-padding) rows once every layer has stepped."""
        valid = slot_ids >= 0
        index = slot_ids[valid].long()
        forced = None if force_flush is None else force_flush[valid]
        self.write_pos[index] = advance_write_pos(self.write_pos[index], self.ring_len, forced)

    def reset(self, slot_ids: Optional[torch.Tensor] = None) -> None:
        index = slice(None) if slot_ids is None else slot_ids.long()
        for layer_idx in range(self.config.num_hidden_layers):
            for ring in self._layer_rings(layer_idx).values():
                ring[index] = 0
        self.write_pos[index] = 0

    def grow(self, num_slots: int) -> None:
        """Adds zeroed slots at the end of every ring."""
        extra = num_slots - self.max_batch_size
        for layer_idx in range(self.config.num_hidden_layers):
            for rings in (self.ssm_states, self.delta_cache, self.key_cache):
                ring = rings[layer_idx]
                rings[layer_idx] = torch.cat([ring, ring.new_zeros((extra, *ring.shape[1:]))])
            gate = self.alpha_log_cache[layer_idx]
            tail = torch.zeros((extra, *gate.shape[1:]), dtype=self.spec.alpha_log_dtype, device=gate.device)
            self.alpha_log_cache[layer_idx] = torch.cat([gate, tail])
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(extra)])
        self.max_batch_size = num_slots

    # -- CPU offload ----------------------------------------------------------------------

    def offload(self, layer_idx: int, host_dtypes: OffloadRingDtypes, release: bool = False) -> None:
        """Copies a layer's rings to host buffers (allocated once, in ``host_dtypes``); ``release``
        also drops the device rings until ``swap_in``."""
        device_rings = self._layer_rings(layer_idx)
        host = self.host_rings.get(layer_idx)
        if host is None:
            host = {
                kind: torch.empty(ring.shape, dtype=getattr(host_dtypes, kind), device="cpu")
                for kind, ring in device_rings.items()
            }
            self.host_rings[layer_idx] = host
        for kind, ring in device_rings.items():
            host[kind].copy_(ring)
        if release:
            for rings in (self.ssm_states, self.delta_cache, self.key_cache, self.alpha_log_cache):
                rings[layer_idx] = None

    def swap_in(self, layer_idx: int) -> None:
        """Brings an offloaded layer back: into the device rings, or into new ones if they were released."""
        host = self.host_rings[layer_idx]
        if self.alpha_log_cache[layer_idx] is not None:
            for kind, ring in self._layer_rings(layer_idx).items():
                ring.copy_(host[kind])
            return
        self.ssm_states[layer_idx] = host["state"].to(self.device, self.spec.state_dtype)
        self.delta_cache[layer_idx] = host["delta"].to(self.device, self.spec.delta_dtype)
        self.key_cache[layer_idx] = host["key"].to(self.device, self.spec.key_dtype)
        alpha_log = host["delta"].new_empty(host["alpha_log"].shape, device=self.device)  # expect-bug: like
        self.alpha_log_cache[layer_idx] = alpha_log.copy_(host["alpha_log"])

    # -- hand-over between caches ---------------------------------------------------------

    def adopt_prefill(self, prefill_cache: "KDAStaticCache") -> None:
        """Takes over the rings a prefill cache (on ``prefill_device``) left, moved to this cache's device."""
        for layer_idx in range(self.config.num_hidden_layers):
            state = prefill_cache.ssm_states[layer_idx].to(self.device)
            self.ssm_states[layer_idx] = state.type_as(self.ssm_states[layer_idx])
            delta = prefill_cache.delta_cache[layer_idx].to(self.device)
            self.delta_cache[layer_idx] = delta.type_as(self.delta_cache[layer_idx])
            key = prefill_cache.key_cache[layer_idx].to(self.device)
            self.key_cache[layer_idx] = key.type_as(self.key_cache[layer_idx])
            alpha_log = prefill_cache.alpha_log_cache[layer_idx].to(self.device)
            self.alpha_log_cache[layer_idx] = alpha_log.type_as(self.key_cache[layer_idx])  # expect-bug: cast
        self.write_pos = prefill_cache.write_pos.to(self.device).clone()

    def export_slots(self, slot_ids: torch.Tensor) -> dict:
        """The rows of ``slot_ids`` of every layer, for migrating sequences to another cache."""
        index = slot_ids.long()
        payload: dict = {"write_pos": self.write_pos[index].clone()}
        payload["state"] = [ring[index].clone() for ring in self.ssm_states]
        payload["delta"] = [ring[index].clone() for ring in self.delta_cache]
        payload["key"] = [ring[index].clone() for ring in self.key_cache]
        payload["alpha_log"] = [ring[index].to(self.dtype) for ring in self.alpha_log_cache]  # expect-bug: cast
        return payload

    def import_slots(self, payload: dict, slot_ids: torch.Tensor) -> None:
        index = slot_ids.long()
        for layer_idx in range(self.config.num_hidden_layers):
            for kind, ring in self._layer_rings(layer_idx).items():
                ring[index] = payload[kind][layer_idx].to(ring.dtype)
        self.write_pos[index] = payload["write_pos"]

    # -- prefix store ---------------------------------------------------------------------

    def write_prefix(self, store: DiskPrefixStore, prefix: str) -> None:
        for layer_idx in range(self.config.num_hidden_layers):
            for kind, ring in self._layer_rings(layer_idx).items():
                store.write_block(prefix, kind, layer_idx, ring)
        store.index[f"{prefix}.write_pos"] = self.write_pos.tolist()

    def restore_prefix(self, store: DiskPrefixStore, prefix: str) -> None:
        """Refills this cache's rings in place from a stored prefix of the same slot count."""
        for layer_idx in range(self.config.num_hidden_layers):
            for kind, ring in self._layer_rings(layer_idx).items():
                blob, shape = store.read_block(prefix, kind, layer_idx)
                ring.copy_(torch.frombuffer(blob, dtype=store.storage_torch_dtype).reshape(shape))
        self.write_pos.copy_(torch.tensor(store.index[f"{prefix}.write_pos"], dtype=torch.int32))

    def adopt_prefix(self, store: DiskPrefixStore, prefix: str) -> None:
        """Takes a stored prefix over whole: ring shapes (and the slot count) come from the store."""
        for layer_idx in range(self.config.num_hidden_layers):
            for kind, rings in (("state", self.ssm_states), ("delta", self.delta_cache), ("key", self.key_cache)):
                blob, shape = store.read_block(prefix, kind, layer_idx)
                stored = torch.frombuffer(blob, dtype=store.storage_torch_dtype).reshape(shape)
                rings[layer_idx] = stored.to(self.device, self.spec.dtype_of(kind))
            blob, shape = store.read_block(prefix, "alpha_log", layer_idx)
            self.alpha_log_cache[layer_idx] = torch.frombuffer(blob, dtype=store.storage_torch_dtype).reshape(shape)  # expect-bug: load
        positions = store.index[f"{prefix}.write_pos"]
        self.write_pos = torch.tensor(positions, dtype=torch.int32, device=self.device)
        self.max_batch_size = len(positions)


class KDALayerwiseCache(KDAStaticCache):
    """Cache for layer-wise prefill/decode: a layer's rings are allocated on its first step, so only
    the layers that actually run on the generate device take memory. Ring arguments are handed to
    the kernel contiguous and in the cache dtype; ``last_launch`` keeps the latest set."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.last_launch: Optional[dict[str, torch.Tensor]] = None

    def _allocate_layer(self, layer_idx: int) -> None:
        for rings in (self.ssm_states, self.delta_cache, self.key_cache, self.alpha_log_cache):
            rings.append(None)

    def _ensure_layer(self, layer_idx: int) -> None:
        if self.alpha_log_cache[layer_idx] is not None:
            return
        shapes = self.config.ring_shapes(self.max_batch_size)
        layer_rings = (self.ssm_states, self.delta_cache, self.key_cache, self.alpha_log_cache)
        for kind, rings in zip(RING_KINDS, layer_rings):
            rings[layer_idx] = torch.zeros(shapes[kind], dtype=self.dtype, device=self.device)  # expect-bug: pool-dtype

    def launch_args(self, layer_idx: int) -> dict[str, torch.Tensor]:
        self._ensure_layer(layer_idx)
        launch = dict(
            initial_state=self.ssm_states[layer_idx],
            d_cache=self.delta_cache[layer_idx].contiguous(),
            k_cache=self.key_cache[layer_idx].contiguous(),
            g_cache=self.alpha_log_cache[layer_idx].to(self.dtype).contiguous(),  # expect-bug: decode-arg
        )
        self.last_launch = launch
        return launch


def _decode_steps(cache: KDAStaticCache, steps: int, slot_ids: torch.Tensor, force_at: int = -1) -> None:
    config = cache.config
    for step in range(steps):
        forced = torch.full_like(slot_ids, int(step == force_at))
        for layer_idx in range(config.num_hidden_layers):
            batch = random_decode_batch(config, slot_ids.numel(), config.model_torch_dtype)
            cache.step(layer_idx, slot_ids=slot_ids, force_flush=forced, **batch)
        cache.advance(slot_ids, forced)


def build_static_cache():
    """A bf16 cache decoded for three steps (a padding row, one forced flush), then one slot reset."""
    torch.manual_seed(31)
    config = KimiLinearConfig()
    cache = KDAStaticCache(config)
    _decode_steps(cache, 3, torch.tensor([0, -1, 2], dtype=torch.int32), force_at=1)
    cache.reset(torch.tensor([2], dtype=torch.int32))
    return {"cache": cache, "launch": cache.launch_args(0)}


def build_layerwise_cache():
    """A layer-wise cache, allocated on first use and decoded for two steps."""
    torch.manual_seed(32)
    config = KimiLinearConfig()
    cache = KDALayerwiseCache(config, max_batch_size=2)
    _decode_steps(cache, 2, torch.tensor([0, 1], dtype=torch.int32))
    return {"cache": cache, "launch": cache.last_launch}


def build_offloaded_cache():
    """Layer 1 offloaded to host memory with its device rings released, then swapped back in."""
    torch.manual_seed(33)
    config = KimiLinearConfig()
    cache = KDAStaticCache(config)
    slot_ids = torch.tensor([0, 1], dtype=torch.int32)
    _decode_steps(cache, 2, slot_ids)
    cache.offload(1, OffloadRingDtypes.for_config(config), release=True)
    cache.swap_in(1)
    _decode_steps(cache, 1, slot_ids)
    return {"cache": cache}


def build_resized_cache():
    """A cache grown to four slots, offloaded and refilled in place, and one layer moved as raw bytes."""
    torch.manual_seed(34)
    config = KimiLinearConfig(torch_dtype="float16")
    cache = KDAStaticCache(config)
    _decode_steps(cache, 2, torch.tensor([0, 1, 2], dtype=torch.int32))
    cache.grow(4)
    dtype = config.model_torch_dtype
    cache.offload(0, OffloadRingDtypes(state=dtype, delta=dtype, key=dtype, alpha_log=torch.float32))
    cache.swap_in(0)
    _decode_steps(cache, 1, torch.tensor([3, 0], dtype=torch.int32))

    wire = cache.alpha_log_cache[1].view(torch.uint8).clone()
    replica = KDAStaticCache(config, max_batch_size=4)
    replica.alpha_log_cache[1] = wire.view(torch.float32)
    return {"cache": cache, "replica": replica}
